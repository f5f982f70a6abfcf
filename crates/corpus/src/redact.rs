//! Rule-based PHI redaction: identifiers become typed placeholders (`[MRN]`, `[SSN]`,
//! `[PHONE]`, `[FAX]`, `[EMAIL]`, `[URL]`, `[DATE]`, `[NAME]`) before tokenization.
//!
//! Rules run in a fixed order, most specific first (a fax number is a phone number with a
//! label; an MRN label wins over a bare number). In anchor-date mode, a document is cut at
//! the first date later than the anchor, as the clinical pipeline's redaction stage does to
//! keep post-index information out of training text.

use std::collections::BTreeMap;

use regex::{Captures, Regex};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phi {
    Email,
    Url,
    Mrn,
    Ssn,
    Fax,
    Phone,
    Date,
    Name,
}

impl Phi {
    pub fn placeholder(self) -> &'static str {
        match self {
            Phi::Email => "[EMAIL]",
            Phi::Url => "[URL]",
            Phi::Mrn => "[MRN]",
            Phi::Ssn => "[SSN]",
            Phi::Fax => "[FAX]",
            Phi::Phone => "[PHONE]",
            Phi::Date => "[DATE]",
            Phi::Name => "[NAME]",
        }
    }
}

/// A calendar date as (year, month, day), comparable.
pub type Ymd = (u32, u32, u32);

pub struct Redactor {
    rules: Vec<(Phi, Regex)>,
    dates: Vec<Regex>,
    anchor: Option<Ymd>,
}

/// What redaction did to one document.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Redaction {
    pub replaced: BTreeMap<&'static str, u64>,
    /// Bytes dropped after a date later than the anchor.
    pub truncated_bytes: u64,
}

const MONTH: &str = r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)";
const PHONE: &str = r"(?:\+?1[\s.-]?)?(?:\(\d{3}\)\s?|\b\d{3}[\s.-])\d{3}[\s.-]\d{4}\b(?:\s*(?:x|ext\.?)\s*\d{1,5}\b)?";

impl Redactor {
    pub fn new(anchor: Option<Ymd>) -> Self {
        let re = |s: &str| Regex::new(s).expect("redaction pattern compiles");
        let rules = vec![
            (
                Phi::Email,
                re(r"(?i)\b[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}\b"),
            ),
            (Phi::Url, re(r#"(?i)\b(?:https?://|www\.)[^\s<>"'\])]+"#)),
            (
                Phi::Mrn,
                re(
                    r"(?i)(\b(?:mrn|medical\s+record(?:\s+(?:number|no\.?|#))?|record\s+(?:number|no\.?|#)|patient\s+id|chart\s+(?:number|no\.?|#))\s*[:#]?\s*)[a-z]{0,3}-?\d{4,12}\b",
                ),
            ),
            (
                Phi::Ssn,
                re(r"(?i)\b\d{3}-\d{2}-\d{4}\b|(\bssn\s*[:#]?\s*)\d{9}\b"),
            ),
            (
                Phi::Fax,
                re(&format!(
                    r"(?i)(\b(?:fax|facsimile)(?:\s*(?:number|no\.?|#))?\s*[:.]?\s*){PHONE}"
                )),
            ),
            (Phi::Phone, re(PHONE)),
            (
                Phi::Name,
                re(
                    r"(\b(?:Dr|Mr|Mrs|Ms|Miss|Mx|Prof|Doctor|Nurse)\.?\s+)[A-Z][A-Za-z'-]+(?:\s+[A-Z]\.)?(?:\s+[A-Z][A-Za-z'-]+)?|(\b(?i:patient\s+name|patient|name|pt)\s*:\s*)[A-Z][A-Za-z'-]+(?:\s+[A-Z]\.)?(?:\s+[A-Z][A-Za-z'-]+)?",
                ),
            ),
        ];
        let dates = vec![
            // 2021-03-04
            re(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b"),
            // 03/04/2021, 3-4-21 (US month first)
            re(r"\b(\d{1,2})[/.-](\d{1,2})[/.-](\d{4}|\d{2})\b"),
            // March 4, 2021 / Mar. 4th 2021
            re(&format!(
                r"(?i)\b({MONTH})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b"
            )),
            // 4 March 2021
            re(&format!(
                r"(?i)\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({MONTH})\.?,?\s+(\d{{4}})\b"
            )),
            // March 2021
            re(&format!(r"(?i)\b({MONTH})\.?,?\s+(\d{{4}})\b")),
        ];
        Self {
            rules,
            dates,
            anchor,
        }
    }

    pub fn redact(&self, text: &str) -> (String, Redaction) {
        let mut report = Redaction::default();
        let mut text = text.to_string();
        if let Some(anchor) = self.anchor {
            if let Some(cut) = self.first_date_after(&text, anchor) {
                report.truncated_bytes = (text.len() - cut) as u64;
                text.truncate(cut);
            }
        }
        for (phi, re) in &self.rules {
            let mut n = 0u64;
            let replaced = re.replace_all(&text, |c: &Captures| {
                // URLs are kept unless they carry an identifier (a query, or a long number).
                let mut tail = "";
                if *phi == Phi::Url {
                    let url = c[0].trim_end_matches(['.', ',', ';', ':', '!', '?']);
                    if !url_has_identifier(url) {
                        return c[0].to_string();
                    }
                    // Sentence punctuation after a URL is not part of it.
                    tail = &c[0][url.len()..];
                }
                n += 1;
                let label = c.iter().skip(1).flatten().next().map_or("", |m| m.as_str());
                format!("{label}{}{tail}", phi.placeholder())
            });
            if n > 0 {
                text = replaced.into_owned();
                *report.replaced.entry(phi.placeholder()).or_default() += n;
            }
        }
        for (kind, re) in self.dates.iter().enumerate() {
            let mut n = 0u64;
            let replaced = re.replace_all(&text, |c: &Captures| {
                if parse_date(kind, c).is_some() {
                    n += 1;
                    Phi::Date.placeholder().to_string()
                } else {
                    c[0].to_string()
                }
            });
            if n > 0 {
                text = replaced.into_owned();
                *report.replaced.entry(Phi::Date.placeholder()).or_default() += n;
            }
        }
        (text, report)
    }

    /// Byte offset of the first date strictly later than `anchor`.
    fn first_date_after(&self, text: &str, anchor: Ymd) -> Option<usize> {
        self.dates
            .iter()
            .enumerate()
            .flat_map(|(kind, re)| re.captures_iter(text).map(move |c| (kind, c)))
            .filter(|(kind, c)| parse_date(*kind, c).is_some_and(|d| d > anchor))
            .map(|(_, c)| c)
            .map(|c| c.get(0).unwrap().start())
            .min()
    }
}

fn month_number(name: &str) -> Option<u32> {
    let n = name.to_ascii_lowercase();
    let months = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    months
        .iter()
        .position(|m| n.starts_with(m))
        .map(|i| i as u32 + 1)
}

/// The date a match of `dates[kind]` names, if it is a real calendar date.
fn parse_date(kind: usize, c: &Captures) -> Option<Ymd> {
    let num = |i: usize| c[i].parse::<u32>().ok();
    let (y, m, d) = match kind {
        0 => (num(1)?, num(2)?, num(3)?),
        1 => {
            let y = num(3)?;
            let y = if c[3].len() == 2 {
                if y <= 40 {
                    2000 + y
                } else {
                    1900 + y
                }
            } else {
                y
            };
            (y, num(1)?, num(2)?)
        }
        2 => (num(3)?, month_number(&c[1])?, num(2)?),
        3 => (num(3)?, month_number(&c[2])?, num(1)?),
        _ => (num(2)?, month_number(&c[1])?, 1),
    };
    ((1800..=2200).contains(&y) && (1..=12).contains(&m) && (1..=31).contains(&d))
        .then_some((y, m, d))
}

fn url_has_identifier(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    lower.contains('?')
        || lower.contains("patient")
        || lower.contains("mrn")
        || url
            .split(|c: char| !c.is_ascii_digit())
            .any(|run| run.len() >= 5)
}

/// Parses `YYYY-MM-DD` (the `--anchor-date` flag).
pub fn parse_anchor(s: &str) -> Option<Ymd> {
    let parts: Vec<&str> = s.split('-').collect();
    let [y, m, d] = parts.as_slice() else {
        return None;
    };
    let (y, m, d) = (y.parse().ok()?, m.parse().ok()?, d.parse().ok()?);
    ((1..=12).contains(&m) && (1..=31).contains(&d)).then_some((y, m, d))
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
