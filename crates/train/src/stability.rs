//! The built-in step policies: stop on a signal, never apply a non-finite step, and respond to
//! loss spikes (detect, record forensics, then wait / roll back / skip / kill).

use anyhow::Result;
use lab_config::{Escalation, SpikeKind, SpikePolicy, Stability};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::detect::{Detector, Flag, Reading};
use crate::forensics::RunningStats;
use crate::policy::{Decision, Journal, Rollback, StepPolicy, StepView, Stop};
use crate::signals::StopSignal;
use crate::stream::SampleRange;

/// SIGINT/SIGTERM: stop after the update under way (or before the first step), after an
/// emergency checkpoint. Asked after each update too, so a signal during the last step stops
/// the run as interrupted rather than going unread.
pub struct Signals(pub StopSignal);

impl Signals {
    fn decision(&self) -> Decision {
        match self.0.received() {
            Some(signal) => Decision::Stop(Stop::Interrupted { signal }),
            None => Decision::Continue,
        }
    }
}

impl StepPolicy for Signals {
    fn name(&self) -> &'static str {
        "signals"
    }
    fn before_step(&mut self, _: u64, _: &mut dyn Journal) -> Decision {
        self.decision()
    }
    fn after_update(&mut self, _: &StepView, _: &mut dyn Journal) -> Decision {
        self.decision()
    }
}

/// A non-finite loss or gradient norm is never applied: roll back at once and skip the data.
pub struct NonFinite;

impl StepPolicy for NonFinite {
    fn name(&self) -> &'static str {
        "non_finite"
    }
    fn after_backward(&mut self, v: &StepView, j: &mut dyn Journal) -> Decision {
        if v.loss.is_finite() && v.grad_norm.is_finite() {
            return Decision::Continue;
        }
        let what = if v.loss.is_finite() {
            "gradient norm"
        } else {
            "loss"
        };
        let reason = format!("non-finite {what} at step {}", v.step + 1);
        j.event(
            v.step + 1,
            "nonfinite",
            json!({ "loss": v.loss.to_string(), "grad_norm": v.grad_norm.to_string(), "lr": v.lr,
                    "ranges": v.data.ranges, "injected": v.data.injected }),
        );
        Decision::Rollback(Rollback {
            to_step: v.step,
            skip: v.data.ranges.clone(),
            reason,
            then_stop: false,
        })
    }
}

/// An open spike: the steps from its onset until the loss is back or the deadline passes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Incident {
    /// Metrics step of the first flagged step.
    onset: u64,
    flag: Flag,
    /// The window's mean loss before the spike.
    baseline: f64,
    peak_loss: f64,
    peak_step: u64,
    /// Data of every step since the onset (what a rollback skips).
    ranges: Vec<SampleRange>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct SpikeState {
    detector: Detector,
    incident: Option<Incident>,
    running: RunningStats,
}

/// Detects spikes and responds as `[stability]` says.
pub struct SpikeResponse {
    cfg: Stability,
    /// The kind of batch injected on purpose (`[spike]`), for the events.
    injected_kind: Option<SpikeKind>,
    state: SpikeState,
}

impl SpikeResponse {
    pub fn new(cfg: Stability, injected_kind: Option<SpikeKind>) -> Self {
        Self {
            cfg,
            injected_kind,
            state: SpikeState::default(),
        }
    }

    /// A step of an open incident: recovered, past its deadline, or still watched.
    fn watch(&mut self, v: &StepView, j: &mut dyn Journal) -> Decision {
        let step = v.step + 1;
        let inc = self.state.incident.as_mut().expect("an open incident");
        inc.ranges.extend_from_slice(&v.data.ranges);
        if v.loss > inc.peak_loss {
            (inc.peak_loss, inc.peak_step) = (v.loss, step);
        }
        let summary = json!({
            "onset": inc.onset, "flag": inc.flag.as_str(), "baseline": inc.baseline,
            "peak_loss": inc.peak_loss, "peak_step": inc.peak_step,
            "peak_ratio": inc.peak_loss / inc.baseline, "loss": v.loss,
        });
        if v.loss <= inc.baseline * (1.0 + self.cfg.recovery_margin) {
            let mut e = summary;
            e["steps_to_recover"] = json!(step - inc.onset);
            e["recovery_margin"] = json!(self.cfg.recovery_margin);
            j.event(step, "spike_recovered", e);
            j.flag_step("recovered");
            j.say(&format!(
                "spike of step {} recovered at step {step}",
                inc.onset
            ));
            self.state.incident = None;
            self.ordinary(v, j);
            return Decision::Continue;
        }
        j.flag_step("recovering");
        if step - inc.onset < self.cfg.recovery_steps as u64 {
            return Decision::Continue;
        }
        let inc = self.state.incident.take().expect("an open incident");
        let reason = format!(
            "loss not back within {} steps of the spike at step {} (loss {:.4}, pre-spike mean {:.4})",
            self.cfg.recovery_steps, inc.onset, v.loss, inc.baseline
        );
        let mut e = summary;
        e["escalate"] = json!(self.cfg.escalate);
        e["reason"] = json!(reason);
        j.event(step, "spike_escalated", e);
        // The weights have taken the spike's updates: either way, back to the last good state.
        Decision::Rollback(Rollback {
            to_step: inc.onset - 1,
            skip: match self.cfg.escalate {
                Escalation::Rollback => inc.ranges,
                Escalation::Kill => Vec::new(), // a person decides what to do with the data
            },
            reason,
            then_stop: self.cfg.escalate == Escalation::Kill,
        })
    }

    /// An ordinary step joins the window and the running batch statistics.
    fn ordinary(&mut self, v: &StepView, j: &mut dyn Journal) {
        let s = &mut self.state;
        s.running.update(&v.data.stats, self.cfg.window);
        if s.detector.accept(&self.cfg, v.loss, v.grad_norm) {
            j.event(
                v.step + 1,
                "plateau",
                json!({ "steps_without_improvement": s.detector.steps_since_best(),
                        "min_delta": self.cfg.plateau_min_delta }),
            );
        }
    }

    fn detected(&mut self, v: &StepView, r: Reading, flag: Flag, j: &mut dyn Journal) -> Decision {
        let step = v.step + 1;
        j.flag_step(flag.as_str());
        let offsets: Vec<usize> = v.data.offsets.iter().copied().take(16).collect();
        j.event(
            step,
            "spike_detected",
            json!({
                "flag": flag.as_str(), "loss": r.loss, "window_mean": r.mean, "window_std": r.std,
                "z": r.z, "ratio": r.ratio, "grad_norm": r.grad_norm,
                "grad_norm_mean": r.grad_norm_mean, "grad_norm_ratio": r.grad_norm_ratio,
                "lr": v.lr, "clip_scale": v.clip_scale, "clipped": v.clip_scale < 1.0,
                "policy": self.cfg.policy,
                "batch": v.data.stats, "running": self.state.running,
                "ranges": v.data.ranges, "file_offsets": offsets, "injected": v.data.injected,
            }),
        );
        let policy = serde_json::to_value(self.cfg.policy).unwrap_or_default();
        let text = format!(
            "{} at step {step}: loss {:.4} is {:.2}× the moving mean {:.4} (z {:.1}), grad norm {:.3} is {:.1}× its mean; policy {}",
            flag.as_str(),
            r.loss,
            r.ratio,
            r.mean,
            r.z,
            r.grad_norm,
            r.grad_norm_ratio,
            policy.as_str().unwrap_or("?")
        );
        j.say(&text);
        j.alert(&text);
        let reason = format!("{} at step {step}", flag.as_str());
        match self.cfg.policy {
            SpikePolicy::Wait => {
                self.state.incident = Some(Incident {
                    onset: step,
                    flag,
                    baseline: r.mean,
                    peak_loss: r.loss,
                    peak_step: step,
                    ranges: v.data.ranges.clone(),
                });
                Decision::Continue
            }
            SpikePolicy::Skip => Decision::SkipUpdate { reason },
            SpikePolicy::Rollback => Decision::Rollback(Rollback {
                to_step: v.step,
                skip: v.data.ranges.clone(),
                reason,
                then_stop: false,
            }),
            SpikePolicy::Kill => Decision::Stop(Stop::Unstable { reason }),
        }
    }
}

impl StepPolicy for SpikeResponse {
    fn name(&self) -> &'static str {
        "spike"
    }

    fn after_backward(&mut self, v: &StepView, j: &mut dyn Journal) -> Decision {
        if v.data.injected {
            j.event(
                v.step + 1,
                "spike_injected",
                json!({ "spike_kind": self.injected_kind.map(SpikeKind::as_str),
                        "loss": v.loss, "grad_norm": v.grad_norm, "ranges": v.data.ranges,
                        "batch": v.data.stats }),
            );
        }
        if !(v.loss.is_finite() && v.grad_norm.is_finite()) {
            return Decision::Continue; // NonFinite answers for these
        }
        if self.state.incident.is_some() {
            return self.watch(v, j);
        }
        let reading = self.state.detector.read(&self.cfg, v.loss, v.grad_norm);
        match reading.and_then(|r| Some((r, Detector::flag(&self.cfg, &r)?))) {
            Some((r, flag)) => self.detected(v, r, flag, j),
            None => {
                self.ordinary(v, j);
                Decision::Continue
            }
        }
    }

    fn rollback_target(&self) -> Option<u64> {
        self.state.incident.as_ref().map(|i| i.onset - 1)
    }

    fn save(&self) -> Option<Value> {
        serde_json::to_value(&self.state).ok()
    }

    fn restore(&mut self, state: Option<&Value>) -> Result<()> {
        self.state = match state {
            Some(v) => serde_json::from_value(v.clone())?,
            None => SpikeState::default(),
        };
        Ok(())
    }
}
