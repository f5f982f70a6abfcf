//! GPU health as a step policy: the device is recorded when the run starts, its readings
//! join every logged metrics row, and the [`Watch`]'s alerts go to events.jsonl, the webhook
//! and the console. It never stops a run: a person decides what an idle or failing GPU means.

use lab_health::{DeviceInfo, Probe, Watch};
use lab_run::hardware::MfuPeak;
use serde_json::json;

use crate::policy::{Decision, Journal, StepPolicy, StepView};

pub struct GpuHealth {
    probe: Box<dyn Probe>,
    /// The device, as the probe described it when it opened.
    gpu: DeviceInfo,
    /// What the run's MFU is measured against (recorded with the device).
    mfu: MfuPeak,
    watch: Watch,
    announced: bool,
    /// Set once a reading fails: said once, then the run goes on without readings.
    off: bool,
}

impl GpuHealth {
    pub fn new(probe: Box<dyn Probe>, watch: Watch, mfu: MfuPeak) -> Self {
        Self {
            gpu: probe.describe(),
            mfu,
            probe,
            watch,
            announced: false,
            off: false,
        }
    }

    fn read(&mut self, step: u64, j: &mut dyn Journal) {
        let sample = match self.probe.sample() {
            Ok(s) => s,
            Err(e) => {
                self.off = true;
                j.say(&format!("warning: GPU readings stopped: {e:#}"));
                j.event(
                    step,
                    "gpu_health_off",
                    json!({ "reason": format!("{e:#}") }),
                );
                return;
            }
        };
        for (name, value) in sample.metrics() {
            j.metric(name, value);
        }
        for alert in self.watch.observe(&sample) {
            let text = alert.text(&self.gpu);
            j.event(step, alert.kind(), alert.fields(&self.gpu));
            j.say(&format!("warning: {text}"));
            j.alert(&text);
        }
    }
}

impl StepPolicy for GpuHealth {
    fn name(&self) -> &'static str {
        "gpu_health"
    }

    fn before_step(&mut self, step: u64, j: &mut dyn Journal) -> Decision {
        if !self.announced {
            self.announced = true;
            let mut fields = json!(self.gpu);
            fields["mfu"] = json!(self.mfu);
            j.event(step, "gpu", fields);
        }
        Decision::Continue
    }

    /// Read on the steps that are logged, right after their forward and backward.
    fn after_backward(&mut self, view: &StepView, j: &mut dyn Journal) -> Decision {
        if view.at_log && !self.off {
            self.read(view.step + 1, j);
        }
        Decision::Continue
    }
}
