//! Dates in the forms clinical text writes them. Safe Harbor removes every date element but
//! the year, so a date with a day or a month becomes `[DATE]`, with or without its year;
//! a bare year stays.

use regex::{Captures, Regex};

/// A calendar date as (year, month, day), comparable.
pub type Ymd = (u32, u32, u32);

const MONTH: &str = r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)";
/// Month names as names are written (Title case or capitals): without a year, "may" and
/// "march" in lower case are words, not dates.
const MONTH_CASED: &str = r"(?:Jan(?:uary)?|JAN(?:UARY)?|Feb(?:ruary)?|FEB(?:RUARY)?|Mar(?:ch)?|MAR(?:CH)?|Apr(?:il)?|APR(?:IL)?|May|MAY|June?|JUNE?|July?|JULY?|Aug(?:ust)?|AUG(?:UST)?|Sep(?:t(?:ember)?)?|SEP(?:T(?:EMBER)?)?|Oct(?:ober)?|OCT(?:OBER)?|Nov(?:ember)?|NOV(?:EMBER)?|Dec(?:ember)?|DEC(?:EMBER)?)";

/// How the groups of one pattern name a date.
#[derive(Clone, Copy)]
enum Form {
    /// (year, month, day) groups.
    Ymd(usize, usize, usize),
    /// Numeric month first, with a 2- or 4-digit year: (month, day, year).
    Mdy,
    /// A month name: (year, month name, day) groups; day 0 means "none".
    Named(usize, usize, usize),
    /// Month and day without a year: (month, day); the month may be a name.
    NoYear(usize, usize),
}

pub struct DatePatterns {
    patterns: Vec<(Regex, Form)>,
}

impl DatePatterns {
    pub fn new() -> Self {
        let re = |s: &str| Regex::new(s).expect("date pattern compiles");
        let patterns = vec![
            // 2021-03-04, 2021/03/04
            (
                re(r"\b(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})\b"),
                Form::Ymd(1, 2, 3),
            ),
            // DOB: 19501225 (digits only, after a birth-date label)
            (
                re(
                    r"(?i)\b(?:dob|date\s+of\s+birth|birth\s*date)[ \t]*:?[ \t]*(\d{4})(\d{2})(\d{2})\b",
                ),
                Form::Ymd(1, 2, 3),
            ),
            // 03/04/2021, 3-4-21 (US month first)
            (
                re(r"\b(\d{1,2})[/.-](\d{1,2})[/.-](\d{4}|\d{2})\b"),
                Form::Mdy,
            ),
            // March 4, 2021 / Mar. 4th 2021
            (
                re(&format!(
                    r"(?i)\b({MONTH})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b"
                )),
                Form::Named(3, 1, 2),
            ),
            // 4 March 2021, 4-Mar-2021, the 4th of March, 2021
            (
                re(&format!(
                    r"(?i)\b(\d{{1,2}})(?:st|nd|rd|th)?(?:\s+of)?[\s-]+({MONTH})\.?,?[\s-]+(\d{{4}})\b"
                )),
                Form::Named(3, 2, 1),
            ),
            // March 2021
            (
                re(&format!(r"(?i)\b({MONTH})\.?,?\s+(\d{{4}})\b")),
                Form::Named(2, 1, 0),
            ),
            // March 4th (no year)
            (
                re(&format!(
                    r"\b({MONTH_CASED})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?\b"
                )),
                Form::NoYear(1, 2),
            ),
            // 4 March, the 4th of March (no year)
            (
                re(&format!(
                    r"\b(\d{{1,2}})(?:st|nd|rd|th)?(?:\s+of)?\s+({MONTH_CASED})\b"
                )),
                Form::NoYear(2, 1),
            ),
            // on 3/14, DOS: 12/1 (no year): only after a word that introduces a date, since
            // 1/2 is also a dose and 8/10 a pain score ("from 8/10" is not a date).
            (
                re(
                    r"(?i)\b(?:on|since|until|till|through|dated|dob|dos|date(?:\s+of\s+(?:service|visit|admission|discharge))?|admitted|discharged|seen|visit)\s*:?\s+(\d{1,2})/(\d{1,2})\b",
                ),
                Form::NoYear(1, 2),
            ),
        ];
        Self { patterns }
    }

    /// Every match of every pattern that names a real date (the year, when it has one).
    pub fn replace_all(&self, text: &str, mut on_date: impl FnMut()) -> String {
        let mut text = text.to_string();
        for (re, form) in &self.patterns {
            let replaced = re.replace_all(&text, |c: &Captures| {
                if parse(*form, c).is_some() {
                    on_date();
                    // A context word before the date is kept: "on [DATE]", "DOB: [DATE]".
                    let whole = c.get(0).expect("match");
                    let first = c.get(1).expect("a date group");
                    let keep = &text[whole.start()..first.start()];
                    format!("{keep}[DATE]")
                } else {
                    c[0].to_string()
                }
            });
            if let std::borrow::Cow::Owned(s) = replaced {
                text = s;
            }
        }
        text
    }

    /// Byte offset of the first date (with a year) strictly later than `anchor`.
    pub fn first_after(&self, text: &str, anchor: Ymd) -> Option<usize> {
        self.patterns
            .iter()
            .flat_map(|(re, form)| re.captures_iter(text).map(move |c| (*form, c)))
            .filter(|(form, c)| {
                parse(*form, c).is_some_and(|(y, m, d)| y > 0 && (y, m, d) > anchor)
            })
            .map(|(_, c)| c.get(0).expect("match").start())
            .min()
    }
}

impl Default for DatePatterns {
    fn default() -> Self {
        Self::new()
    }
}

/// The date a match names, if it is a real calendar date; year 0 when it has none.
fn parse(form: Form, c: &Captures) -> Option<Ymd> {
    let num = |i: usize| c[i].parse::<u32>().ok();
    let month = |i: usize| num(i).or_else(|| month_number(&c[i]));
    let (y, m, d) = match form {
        Form::Ymd(y, m, d) => (num(y)?, num(m)?, num(d)?),
        Form::Mdy => {
            let y = num(3)?;
            let y = match c[3].len() {
                2 if y <= 40 => 2000 + y,
                2 => 1900 + y,
                _ => y,
            };
            // 25/12/1950 can only be day first.
            let (a, b) = (num(1)?, num(2)?);
            if a > 12 && b <= 12 {
                (y, b, a)
            } else {
                (y, a, b)
            }
        }
        Form::Named(y, m, 0) => (num(y)?, month_number(&c[m])?, 1),
        Form::Named(y, m, d) => (num(y)?, month_number(&c[m])?, num(d)?),
        Form::NoYear(m, d) => (0, month(m)?, num(d)?),
    };
    let year_ok = y == 0 || (1800..=2200).contains(&y);
    (year_ok && (1..=12).contains(&m) && (1..=31).contains(&d)).then_some((y, m, d))
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

/// Parses `YYYY-MM-DD` (the `--anchor-date` flag).
pub fn parse_anchor(s: &str) -> Option<Ymd> {
    let parts: Vec<&str> = s.split('-').collect();
    let [y, m, d] = parts.as_slice() else {
        return None;
    };
    let (y, m, d) = (y.parse().ok()?, m.parse().ok()?, d.parse().ok()?);
    ((1..=12).contains(&m) && (1..=31).contains(&d)).then_some((y, m, d))
}
