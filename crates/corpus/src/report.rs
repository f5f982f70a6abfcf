//! The per-filter, per-type removal report: printed as a table and stored in meta.json.

use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Count {
    pub docs: u64,
    pub tokens: u64,
    /// Raw text bytes (before cleaning), for throughput.
    pub bytes: u64,
}

impl Count {
    pub fn add(&mut self, tokens: u64, bytes: u64) {
        self.docs += 1;
        self.tokens += tokens;
        self.bytes += bytes;
    }
}

/// Documents and tokens per document type, for one stage.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ByType(pub BTreeMap<String, Count>);

impl ByType {
    pub fn add(&mut self, doc_type: &str, tokens: u64, bytes: u64) {
        if let Some(c) = self.0.get_mut(doc_type) {
            c.add(tokens, bytes);
        } else {
            let mut c = Count::default();
            c.add(tokens, bytes);
            self.0.insert(doc_type.to_string(), c);
        }
    }
    pub fn total(&self) -> Count {
        self.0.values().fold(Count::default(), |a, c| Count {
            docs: a.docs + c.docs,
            tokens: a.tokens + c.tokens,
            bytes: a.bytes + c.bytes,
        })
    }
}

/// One row of the report: a filter, its settings and what it removed.
#[derive(Debug, Clone, Serialize)]
pub struct FilterReport {
    pub name: String,
    pub settings: serde_json::Value,
    pub removed: ByType,
}

impl FilterReport {
    pub fn to_json(&self) -> serde_json::Value {
        let total = self.removed.total();
        serde_json::json!({
            "name": self.name,
            "settings": self.settings,
            "removed_docs": total.docs,
            "removed_tokens": total.tokens,
            "removed_by_type": self.removed.0.iter().map(|(t, c)| {
                (t.clone(), serde_json::json!({"docs": c.docs, "tokens": c.tokens}))
            }).collect::<serde_json::Map<_, _>>(),
        })
    }
}

/// The report as a text table: one row per (filter, type) plus totals against the input.
pub fn table(input: &ByType, filters: &[FilterReport], kept: &ByType) -> String {
    let mut out = String::new();
    let line = |out: &mut String, stage: &str, ty: &str, c: Count, of: Count| {
        let pct = if of.docs == 0 {
            0.0
        } else {
            100.0 * c.docs as f64 / of.docs as f64
        };
        out.push_str(&format!(
            "{stage:<26} {ty:<20} {:>10} {:>7.2}% {:>13}\n",
            c.docs, pct, c.tokens
        ));
    };
    out.push_str(&format!(
        "{:<26} {:<20} {:>10} {:>8} {:>13}\n",
        "stage", "type", "docs", "of input", "tokens"
    ));
    let of = |ty: &str| input.0.get(ty).copied().unwrap_or_default();
    for (ty, c) in &input.0 {
        line(&mut out, "input", ty, *c, *c);
    }
    line(&mut out, "input", "(all)", input.total(), input.total());
    for f in filters {
        for (ty, c) in &f.removed.0 {
            line(&mut out, &format!("- {}", f.name), ty, *c, of(ty));
        }
        line(
            &mut out,
            &format!("- {}", f.name),
            "(all)",
            f.removed.total(),
            input.total(),
        );
    }
    for (ty, c) in &kept.0 {
        line(&mut out, "= kept", ty, *c, of(ty));
    }
    line(&mut out, "= kept", "(all)", kept.total(), input.total());
    out
}
