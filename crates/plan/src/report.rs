//! The default output: aligned text tables, one section per question a plan answers.

use std::fmt::Write;

use crate::units::{gib, group, hours, sci, si, usd};
use crate::Plan;

/// Columns aligned on their widest cell; the first column left-aligned, the rest right.
pub struct Table {
    rows: Vec<Vec<String>>,
    /// Text columns (left-aligned) besides the first.
    left: Vec<usize>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table {
            rows: vec![header.iter().map(|h| h.to_string()).collect()],
            left: vec![0],
        }
    }

    /// Left-aligns these columns (text rather than numbers).
    pub fn left_aligned(mut self, columns: &[usize]) -> Self {
        self.left.extend_from_slice(columns);
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self, indent: &str) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let width = |c: usize| {
            self.rows
                .iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..columns).map(width).collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::from(indent);
            for (c, cell) in row.iter().enumerate() {
                let pad = widths[c] - cell.chars().count();
                if c > 0 {
                    line.push_str("  ");
                }
                if self.left.contains(&c) {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad));
                } else {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Key/value lines: the first column padded.
fn pairs(rows: &[(String, String)], indent: &str) -> String {
    let width = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, v)| {
            format!(
                "{indent}{k}{}  {v}\n",
                " ".repeat(width - k.chars().count())
            )
        })
        .collect()
}

fn pct(part: u64, whole: u64) -> String {
    format!("{:.1}%", part as f64 / whole as f64 * 100.0)
}

/// A billed figure, with the compute-only one beside it where they differ.
fn billed(billed: f64, compute: f64, show: &dyn Fn(f64) -> String) -> String {
    match (billed - compute).abs() < 0.5 {
        true => show(billed),
        false => format!("{} (compute {})", show(billed), show(compute)),
    }
}

pub fn render(plan: &Plan) -> String {
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(
        w,
        "lab plan: {} on {} × {} ({:.0} TFLOP/s peak per GPU)\n",
        plan.config,
        plan.gpus,
        plan.device,
        plan.peak_flops_per_gpu / 1e12
    );

    let _ = writeln!(w, "Assumptions");
    let rows: Vec<(String, String)> = plan
        .assumptions
        .iter()
        .map(|a| (a.name.to_string(), format!("{}   [{}]", a.value, a.source)))
        .collect();
    w.push_str(&pairs(&rows, "  "));

    let p = &plan.params;
    let _ = writeln!(w, "\nParameters");
    let mut t = Table::new(&["component", "count", "share"]);
    for (name, n) in [
        ("embedding", p.embedding),
        ("attention", p.attention),
        ("ffn", p.ffn),
        ("norms", p.norms),
        (
            if p.tied_embeddings {
                "lm_head (tied)"
            } else {
                "lm_head"
            },
            p.lm_head,
        ),
    ] {
        t.row(vec![name.into(), group(n), pct(n, p.total)]);
    }
    t.row(vec![
        "total".into(),
        group(p.total),
        format!("{}", si(p.total as f64)),
    ]);
    t.row(vec![
        "non-embedding".into(),
        group(p.non_embedding),
        si(p.non_embedding as f64),
    ]);
    if let Some(n) = p.override_params {
        t.row(vec![
            "planned with (--params)".into(),
            group(n.round() as u64),
            si(n),
        ]);
    }
    w.push_str(&t.render("  "));
    if let Some(r) = &p.reference {
        let _ = writeln!(
            w,
            "  vs {} ({}, {}):",
            r.name,
            group(r.params),
            r.matched_by
        );
        let mut t = Table::new(&["component", "this config", r.name, "difference", "because"])
            .left_aligned(&[4]);
        for c in &r.components {
            t.row(vec![
                c.component.into(),
                group(c.config),
                group(c.reference),
                signed_group(c.delta),
                c.because.clone(),
            ]);
        }
        w.push_str(&t.render("    "));
    }

    let first_mfu = plan.scenarios[0].mfu;
    let _ = writeln!(w, "\nFLOPs per token (* = used for time and cost)");
    let mut header = vec![
        "convention".to_string(),
        "FLOPs/token".into(),
        "total FLOPs".into(),
        format!("tokens/s @ MFU {first_mfu:.2}"),
        "compute".into(),
    ];
    if plan.deadline.is_some() {
        header.push("MFU for deadline".into());
    }
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = Table::new(&header_refs);
    for f in &plan.flops {
        let mut row = vec![
            format!(
                "{} {}",
                if f.convention.used { "*" } else { " " },
                f.convention.name
            ),
            sci(f.convention.flops_per_token),
            sci(f.total_flops),
            si(f.tokens_per_s),
            hours(f.compute_hours),
        ];
        if let Some(m) = f.mfu_for_deadline {
            row.push(format!("{m:.2}"));
        }
        t.row(row);
    }
    w.push_str(&t.render("  "));

    let b = &plan.batch;
    let c = &plan.chinchilla;
    let _ = writeln!(w, "\nTokens and steps");
    w.push_str(&pairs(
        &[
            (
                "tokens".into(),
                format!(
                    "{} = {:.1} per parameter (Chinchilla-optimal 20: {})",
                    si(plan.scenarios[0].tokens),
                    c.planned_tokens_per_param,
                    si(c.optimal_tokens)
                ),
            ),
            (
                "global batch".into(),
                format!(
                    "{} tokens = {} sequences/step",
                    group(b.global_batch_tokens.round() as u64),
                    format_count(b.sequences_per_step)
                ),
            ),
            (
                "steps".into(),
                format!(
                    "{} (config train.total_steps: {})",
                    group(b.steps),
                    group(b.config_total_steps as u64)
                ),
            ),
            (
                "per replica".into(),
                format!(
                    "{} data-parallel replicas × micro-batch {} × {} micro-batches",
                    b.data_parallel,
                    b.micro_batch,
                    format_count(b.grad_accum)
                ),
            ),
            (
                "compute-optimal".into(),
                format!(
                    "{} FLOPs buy {} parameters on {} tokens",
                    sci(c.flop_budget),
                    si(c.compute_optimal_params),
                    si(c.compute_optimal_tokens)
                ),
            ),
        ],
        "  ",
    ));

    let _ = writeln!(
        w,
        "\nTime and cost (billed = wall clock × GPUs; compute = GPU-hours of FLOPs alone)"
    );
    let mut header = vec![
        "MFU".to_string(),
        "tokens/s".into(),
        "per GPU".into(),
        "compute".into(),
        "wall clock".into(),
        "GPU-hours".into(),
    ];
    for c in &plan.scenarios[0].costs {
        header.push(format!("{} ${:.2}", c.price, c.usd_per_gpu_hour));
    }
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = Table::new(&header_refs);
    for s in &plan.scenarios {
        let mut row = vec![
            format!("{:.2}", s.mfu),
            si(s.tokens_per_s),
            si(s.tokens_per_s_per_gpu),
            hours(s.compute_hours),
            hours(s.wall_clock_hours),
            // Billed, as the dollars beside it are.
            billed(s.billed_gpu_hours, s.compute_gpu_hours, &|h| {
                group(h.round() as u64)
            }),
        ];
        for c in &s.costs {
            row.push(billed(c.billed_usd, c.compute_usd, &usd));
        }
        t.row(row);
    }
    w.push_str(&t.render("  "));
    if let Some(d) = &plan.deadline {
        let _ = writeln!(
            w,
            "  deadline {}: needs MFU {:.2}; buys {}",
            hours(d.hours),
            d.required_mfu,
            d.buys
                .iter()
                .zip(&plan.scenarios)
                .map(|(b, s)| format!(
                    "{} steps = {} tokens at MFU {:.2}",
                    group(b.steps),
                    si(b.tokens),
                    s.mfu
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let _ = writeln!(
            w,
            "  renting {} × {} for {}: {}",
            plan.gpus,
            plan.device,
            hours(d.hours),
            d.rental
                .iter()
                .map(|r| format!("{} {}", r.price, usd(r.usd)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if let Some(bud) = &plan.budget {
        for b in &bud.buys {
            let _ = writeln!(
                w,
                "  {} buys {} of the cluster = {} steps = {} tokens at MFU {first_mfu:.2}",
                b.limit,
                hours(b.wall_clock_hours),
                group(b.steps),
                si(b.tokens)
            );
        }
    }
    let limits_broken = plan
        .warnings
        .iter()
        .any(|w| matches!(w.kind, "deadline" | "budget" | "mfu"));
    if let Some(p) = plan.proposal.as_ref().filter(|_| limits_broken) {
        let _ = writeln!(
            w,
            "  proposal: {} steps ({} tokens) fit {} at MFU {first_mfu:.2}",
            group(p.steps),
            si(p.tokens),
            p.limit
        );
    }
    if let Some(q) = &plan.quote {
        let _ = writeln!(
            w,
            "  quote ${}/h for {} ({}):",
            q.usd_per_hour,
            hours(q.hours),
            q.hours_from
        );
        let mut t = Table::new(&["reading", "$/GPU-hour", "total", "plausible"]).left_aligned(&[3]);
        for r in &q.readings {
            t.row(vec![
                r.reading.clone(),
                format!("${:.2}", r.usd_per_gpu_hour),
                usd(r.total_usd),
                match r.plausible {
                    Some(true) => "yes".into(),
                    Some(false) => "no".into(),
                    None => "?".into(),
                },
            ]);
        }
        w.push_str(&t.render("    "));
        if let Some((lo, hi)) = q.plausible_usd_per_gpu_hour {
            let _ = writeln!(
                w,
                "    plausible band ${lo:.2}–${hi:.2}/GPU-h: half the lowest to twice the highest table price for {}",
                plan.device
            );
        }
    }

    let m = &plan.memory;
    let l = &m.layout;
    let _ = writeln!(
        w,
        "\nMemory per GPU, GiB (DP {} × TP {} × PP {}; micro-batch {}; device {} GiB; * = chosen)",
        l.dp,
        l.tp,
        l.pp,
        l.micro_batch,
        gib(m.device_memory_bytes)
    );
    let mut t = Table::new(&[
        "stage",
        "weights",
        "grads",
        "fp32 master",
        "Adam m+v",
        "comm",
        "activations",
        "act. ckpt",
        "total",
        "total ckpt",
        "fits",
    ]);
    for s in &m.stages {
        let chosen = s.zero_stage == l.zero_stage;
        let name = match s.zero_stage {
            0 => "DDP (ZeRO-0)".to_string(),
            z => format!("ZeRO-{z} / {}", s.shard),
        };
        let fits = |total: f64| total <= m.device_memory_bytes;
        t.row(vec![
            format!("{} {name}", if chosen { "*" } else { " " }),
            gib(s.params),
            gib(s.grads),
            gib(s.master),
            gib(s.moments),
            gib(s.comm_buffers),
            gib(s.activations),
            gib(s.activations_checkpointed),
            gib(s.total_without_checkpointing),
            gib(s.total_with_checkpointing),
            match (
                fits(s.total_without_checkpointing),
                fits(s.total_with_checkpointing),
            ) {
                (true, _) => "yes".into(),
                (false, true) => "with ckpt".into(),
                (false, false) => "no".into(),
            },
        ]);
    }
    w.push_str(&t.render("  "));
    let _ = writeln!(
        w,
        "  chosen: {} GiB of {} GiB{}",
        gib(m.chosen.total),
        gib(m.device_memory_bytes),
        if l.activation_checkpointing {
            " (activation checkpointing)"
        } else {
            ""
        }
    );

    let ck = &plan.checkpoint;
    let _ = writeln!(w, "\nCheckpoints");
    w.push_str(&pairs(
        &[
            (
                "resumable".into(),
                format!(
                    "{} GB (fp32 weights + Adam m, v: 12 bytes/parameter); fp32 weights alone {} GB",
                    format_count(ck.resumable_bytes / 1e9),
                    format_count(ck.weights_bytes / 1e9)
                ),
            ),
            (
                "write".into(),
                format!(
                    "{:.1} s at {} GB/s, every {} steps ({} checkpoints, {:.1}% of the compute between them)",
                    ck.write_seconds,
                    ck.storage_bytes_per_s / 1e9,
                    group(ck.every_steps as u64),
                    group(ck.count),
                    ck.share_of_interval * 100.0
                ),
            ),
        ],
        "  ",
    ));

    if !plan.warnings.is_empty() {
        let _ = writeln!(w, "\nWarnings");
        for warning in &plan.warnings {
            let _ = writeln!(w, "  ! [{}] {}", warning.kind, warning.message);
        }
    }
    if !plan.notes.is_empty() {
        let _ = writeln!(w, "\nNotes");
        for n in &plan.notes {
            let _ = writeln!(w, "  - {n}");
        }
    }
    out
}

/// `+131,072,000`, `-805,306,368`, `0`.
pub fn signed_group(n: i64) -> String {
    match n.signum() {
        1 => format!("+{}", group(n as u64)),
        -1 => format!("-{}", group(n.unsigned_abs())),
        _ => "0".into(),
    }
}

/// Whole numbers with separators, others with up to two decimals.
fn format_count(x: f64) -> String {
    if x.fract().abs() < 1e-9 && x.abs() < 1e15 {
        group(x.round() as u64)
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_aligned_text_columns() {
        let mut t = Table::new(&["a", "why"]).left_aligned(&[1]);
        t.row(vec!["x".into(), "because".into()]);
        assert_eq!(t.render(""), "a  why\nx  because\n");
        assert_eq!(signed_group(-805_306_368), "-805,306,368");
        assert_eq!(signed_group(131_072_000), "+131,072,000");
        assert_eq!(signed_group(0), "0");
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(&["name", "n"]);
        t.row(vec!["a".into(), "1,000".into()]);
        t.row(vec!["longer".into(), "7".into()]);
        let text = t.render("");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "name        n");
        assert_eq!(lines[1], "a       1,000");
        assert_eq!(lines[2], "longer      7");
    }
}
