//! Rule-based PHI redaction for the HIPAA Safe Harbor categories that appear in clinical
//! text: identifiers become typed placeholders (`[NAME]`, `[ADDRESS]`, `[LOCATION]`, `[ZIP]`,
//! `[DATE]`, `[AGE]`, `[PHONE]`, `[FAX]`, `[EMAIL]`, `[SSN]`, `[MRN]`, `[HEALTH_PLAN]`,
//! `[ACCOUNT]`, `[LICENSE]`, `[VEHICLE]`, `[DEVICE]`, `[URL]`, `[IP]`) before tokenization.
//!
//! Stages run in a fixed order, most specific first: structured identifiers and street
//! addresses (`rules`), dates and ages (`dates`), person names (`names`: contexts, gazetteer,
//! propagation), then places (a city before a state, a ZIP code). In anchor-date mode a
//! document is first cut at its first date later than the anchor, as the clinical pipeline's
//! redaction stage does to keep post-index information out of training text.

mod dates;
pub(crate) mod names;
mod rules;

use std::collections::BTreeMap;

use regex::Captures;

use dates::DatePatterns;
pub use dates::{parse_anchor, Ymd};
use names::NameFinder;
use rules::Rule;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phi {
    Name,
    Address,
    Location,
    Zip,
    Date,
    Age,
    Phone,
    Fax,
    Email,
    Ssn,
    Mrn,
    HealthPlan,
    Account,
    License,
    Vehicle,
    Device,
    Url,
    Ip,
}

impl Phi {
    pub const ALL: [Phi; 18] = [
        Phi::Name,
        Phi::Address,
        Phi::Location,
        Phi::Zip,
        Phi::Date,
        Phi::Age,
        Phi::Phone,
        Phi::Fax,
        Phi::Email,
        Phi::Ssn,
        Phi::Mrn,
        Phi::HealthPlan,
        Phi::Account,
        Phi::License,
        Phi::Vehicle,
        Phi::Device,
        Phi::Url,
        Phi::Ip,
    ];

    pub fn placeholder(self) -> &'static str {
        match self {
            Phi::Name => "[NAME]",
            Phi::Address => "[ADDRESS]",
            Phi::Location => "[LOCATION]",
            Phi::Zip => "[ZIP]",
            Phi::Date => "[DATE]",
            Phi::Age => "[AGE]",
            Phi::Phone => "[PHONE]",
            Phi::Fax => "[FAX]",
            Phi::Email => "[EMAIL]",
            Phi::Ssn => "[SSN]",
            Phi::Mrn => "[MRN]",
            Phi::HealthPlan => "[HEALTH_PLAN]",
            Phi::Account => "[ACCOUNT]",
            Phi::License => "[LICENSE]",
            Phi::Vehicle => "[VEHICLE]",
            Phi::Device => "[DEVICE]",
            Phi::Url => "[URL]",
            Phi::Ip => "[IP]",
        }
    }
}

pub struct Redactor {
    identifiers: Vec<Rule>,
    dates: DatePatterns,
    ages: Vec<Rule>,
    names: NameFinder,
    places: Vec<Rule>,
    anchor: Option<Ymd>,
}

/// What redaction did to one document.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Redaction {
    pub replaced: BTreeMap<&'static str, u64>,
    /// Bytes dropped after a date later than the anchor.
    pub truncated_bytes: u64,
}

impl Redaction {
    fn add(&mut self, phi: Phi, n: u64) {
        if n > 0 {
            *self.replaced.entry(phi.placeholder()).or_default() += n;
        }
    }
}

impl Redactor {
    pub fn new(anchor: Option<Ymd>) -> Self {
        Self {
            identifiers: rules::rules(),
            dates: DatePatterns::new(),
            ages: rules::age_rules(),
            names: NameFinder::new(),
            places: rules::place_rules(),
            anchor,
        }
    }

    pub fn redact(&self, text: &str) -> (String, Redaction) {
        let mut report = Redaction::default();
        let mut text = text.to_string();
        if let Some(anchor) = self.anchor {
            if let Some(cut) = self.dates.first_after(&text, anchor) {
                report.truncated_bytes = (text.len() - cut) as u64;
                text.truncate(cut);
            }
        }
        for rule in &self.identifiers {
            text = apply(rule, text, &mut report);
        }
        let mut n = 0;
        text = self.dates.replace_all(&text, || n += 1);
        report.add(Phi::Date, n);
        for rule in &self.ages {
            text = apply(rule, text, &mut report);
        }
        text = self.redact_names(text, &mut report);
        for rule in &self.places {
            text = apply(rule, text, &mut report);
        }
        (text, report)
    }

    fn redact_names(&self, text: String, report: &mut Redaction) -> String {
        let found = self.names.find(&text);
        if found.is_empty() {
            return text;
        }
        report.add(Phi::Name, found.len() as u64);
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for r in found {
            out.push_str(&text[at..r.start]);
            out.push_str(Phi::Name.placeholder());
            at = r.end;
        }
        out.push_str(&text[at..]);
        out
    }
}

/// Runs one rule over `text`, keeping its `pre`/`post` groups around the placeholder.
fn apply(rule: &Rule, text: String, report: &mut Redaction) -> String {
    let mut n = 0u64;
    let replaced = rule.re.replace_all(&text, |c: &Captures| {
        if !(rule.accept)(c) {
            return c[0].to_string();
        }
        n += 1;
        let group = |name: &str| c.name(name).map_or("", |m| m.as_str());
        // Sentence punctuation after a URL is not part of it.
        let tail = match rule.phi {
            Phi::Url => {
                let url = c[0].trim_end_matches(['.', ',', ';', ':', '!', '?']);
                &c[0][url.len()..]
            }
            _ => "",
        };
        // `next` is only looked at (by the rule's check), never replaced.
        format!(
            "{}{}{}{}{tail}",
            group("pre"),
            rule.phi.placeholder(),
            group("post"),
            group("next")
        )
    });
    // Borrowed: nothing matched, and the text is kept rather than copied.
    let owned = match replaced {
        std::borrow::Cow::Owned(s) => Some(s),
        std::borrow::Cow::Borrowed(_) => None,
    };
    report.add(rule.phi, n);
    owned.unwrap_or(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_placeholders_replace_identifiers_and_keep_labels() {
        let r = Redactor::new(None);
        let (out, rep) = r.redact(
            "Seen by Dr. Alice Moreno on 03/14/2022. MRN: 00123456. Call (617) 555-0142, fax: 617-555-0199, \
             mail a.moreno@example.org. SSN 123-45-6789. Portal https://mychart.example.org/visit?id=99812.",
        );
        assert_eq!(
            out,
            "Seen by Dr. [NAME] on [DATE]. MRN: [MRN]. Call [PHONE], fax: [FAX], \
             mail [EMAIL]. SSN [SSN]. Portal [URL]."
        );
        assert_eq!(rep.replaced.values().sum::<u64>(), 8);
    }

    #[test]
    fn ordinary_medical_text_is_left_alone() {
        let r = Redactor::new(None);
        let text = "In 2010, about 5 in 100,000 adults had ALL. See https://www.cancer.gov/types/leukemia for more.";
        assert_eq!(r.redact(text).0, text);
        // Labels followed by values that are not identifiers.
        let text = "Serial 12-lead ECGs in age group 18-64; VIN 3 on biopsy; policy 2020 on \
                    COVID-19; device HbA1c; a lot 500mg. Serial CA-125 levels, serial CA19-9; \
                    device 670G; group V600E; Encounter 99214; Medicaid 250000 enrollees; \
                    the number for Medicare is 1-800-MEDICARE.";
        assert_eq!(r.redact(text).0, text);
    }

    #[test]
    fn identifiers_after_a_bare_label_are_redacted() {
        let r = Redactor::new(None);
        for (text, want) in [
            ("VIN 1HGCM82633A004352 noted.", "VIN [VEHICLE] noted."),
            (
                "Her license plate is 4ABC123.",
                "Her license plate is [VEHICLE].",
            ),
            ("Plate number MA 7XYZ21.", "Plate number MA [VEHICLE]."),
            ("Pump S/N 778123-X.", "Pump S/N [DEVICE]."),
            (
                "The device serial SN-99812-A.",
                "The device serial [DEVICE].",
            ),
            ("Acct 12345678 billed.", "Acct [ACCOUNT] billed."),
            ("NPI 1234567890.", "NPI [LICENSE]."),
            ("Driver's license S12345678.", "Driver's license [LICENSE]."),
            ("Policy 99887766 active.", "Policy [HEALTH_PLAN] active."),
            (
                "Policy number is 12345678.",
                "Policy number is [HEALTH_PLAN].",
            ),
            (
                "His Medicare number is 1EG4TE5MK72.",
                "His Medicare number is [HEALTH_PLAN].",
            ),
            (
                "Device identifier: 12345678.",
                "Device identifier: [DEVICE].",
            ),
            ("The plate 7XYZ21.", "The plate [VEHICLE]."),
        ] {
            assert_eq!(r.redact(text).0, want);
        }
    }

    #[test]
    fn anchor_mode_drops_text_after_a_later_date() {
        let r = Redactor::new(parse_anchor("2021-06-30"));
        let (out, rep) =
            r.redact("Admitted 2021-06-01 with pneumonia. Follow-up on July 4, 2021: improved.");
        assert_eq!(out, "Admitted [DATE] with pneumonia. Follow-up on ");
        assert!(rep.truncated_bytes > 0);
    }
}
