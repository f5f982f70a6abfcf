//! Person names: found by context (a label, a title, a credential, a relative, a signature)
//! or by the first-name gazetteer (a known first name followed by a name-shaped word), then
//! propagated: once a name is found, every other occurrence of its parts in the document is
//! redacted too.
//!
//! The name lists are the US Census Bureau's 1990 name frequency files (public domain), shipped
//! in `corpora/names/` and compiled into the binary.

use std::collections::HashSet;
use std::ops::Range;

use regex::Regex;

const FIRST_NAMES: &str = include_str!("../../corpora/names/first-names.txt");
/// First names that are also everyday words ("Hope", "Will", "Grace"): the gazetteer leaves
/// them to the context rules.
const COMMON_WORD_FIRST_NAMES: &str =
    include_str!("../../corpora/names/common-word-first-names.txt");

/// A name-shaped word: Title case or capitals, with O'Brien / Smith-Jones / McDonald forms.
const WORD: &str = r"[A-Z][A-Za-z]*(?:['’-][A-Za-z]+)*";

const CREDENTIAL: &str =
    r"(?:MD|M\.D\.|DO|RN|NP|PA-C|PhD|PharmD|MSW|LCSW|CNM|DDS|FNP|APRN|LPN|CNA)";
/// Titles as written in running text. Capital "MS." also ends sentences about multiple
/// sclerosis, so capital titles count only before a capital name (see `contexts`).
const TITLE: &str = r"(?:Dr|Mr|Mrs|Ms|Miss|Mx|Prof|Doctor|Nurse)";

/// Capitalised words that follow a first name without making a person of it: eponyms
/// ("Addison disease"), institutions, places and the months.
const NOT_SURNAMES: &[&str] = &[
    "disease",
    "syndrome",
    "disorder",
    "palsy",
    "sign",
    "signs",
    "test",
    "tumor",
    "tumour",
    "anomaly",
    "phenomenon",
    "reflex",
    "type",
    "hospital",
    "clinic",
    "medical",
    "center",
    "centre",
    "university",
    "college",
    "county",
    "health",
    "institute",
    "foundation",
    "association",
    "society",
    "street",
    "avenue",
    "road",
    "boulevard",
    "lane",
    "drive",
    "court",
    "place",
    "way",
    "parkway",
    "highway",
    "square",
    "river",
    "lake",
    "mountain",
    "island",
    "valley",
    "city",
    "national",
    "state",
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
    "the",
    "and",
    "of",
    "zip",
    "code",
    "phone",
    "fax",
];

/// Words that make the capitalised word before them an eponym.
const EPONYM_HEADS: &str = "disease|syndrome|disorder|palsy|sign|test|tumou?r|anomaly|phenomenon|reflex|lymphoma|sarcoma|dementia|chorea|ataxia|dystrophy|atrophy|arthritis|ulcer|encephalopathy|neuropathy|neuralgia|virus|cyst|deformity|fracture|procedure|operation|maneuver|scale|score|classification|criteria|cell|cells|body|bodies|law|effect|method|syndromes|diseases|disorders|type|variant|anemia|leukemia|myopathy|thyroiditis|gene|protein|foundation|association|center|institute";

/// Words around names that are never name parts themselves.
const NEVER_PARTS: &[&str] = &[
    "dr", "mr", "mrs", "ms", "miss", "mx", "prof", "doctor", "nurse", "md", "do", "rn", "np", "pa",
    "phd", "patient", "name", "the", "and", "of", "for", "by", "jr", "sr", "ii", "iii",
];

pub struct NameFinder {
    first: HashSet<String>,
    common_word_first: HashSet<String>,
    contexts: Vec<Regex>,
    word: Regex,
    /// Capitalised words before a disease word: "Parkinson disease", "Graves' disease",
    /// "Rabson Mendenhall syndrome".
    eponym: Regex,
}

fn lowercase_set(list: &str) -> HashSet<String> {
    list.lines()
        .map(|l| l.trim().to_lowercase())
        .filter(|l| !l.is_empty())
        .collect()
}

impl NameFinder {
    pub fn new() -> Self {
        let re = |s: String| Regex::new(&s).expect("name pattern compiles");
        // One to four name words on one line, or "Last, First".
        let name = format!(
            r"(?P<name>{WORD},[ \t]+{WORD}(?:[ \t]+[A-Z]\.)?|{WORD}(?:[ \t]+(?:[A-Z]\.|{WORD})){{0,3}})"
        );
        // A title after a label belongs to the context, not to the name: "Seen by Dr. Ruiz".
        let titled = format!(r"(?:{TITLE}\.?[ \t]+)?{name}");
        let contexts = vec![
            // Label contexts: "Patient: ", "Discharge summary for ", "Electronically signed by ".
            re(format!(
                r"(?i:\b(?:patient(?:'s)?\s+name|patient|pt|name|full\s+name|attending(?:\s+physician)?|physician|provider|pcp|primary\s+care(?:\s+physician)?|referring(?:\s+physician)?|surgeon|resident|nurse|rn|cc|author|emergency\s+contact|next\s+of\s+kin|contact(?:\s+person)?|guarantor|spouse|mother|father|informant|interpreter|caregiver|witness)[ \t]*:[ \t]*|\b(?:discharge\s+summary\s+for|summary\s+for|note\s+for|seen\s+by|examined\s+by|referred\s+by|(?:electronically\s+)?signed(?:\s+by)?|dictated\s+by|transcribed\s+by|cosigned\s+by|attended\s+by|dear)[ \t]*:?[ \t]+){titled}"
            )),
            // Titles: "Dr. ", "Mrs ".
            re(format!(r"\b{TITLE}\.?[ \t]+{name}")),
            re(r"\b(?:DR|MR|MRS|MS|MISS|PROF)\.?[ \t]+(?P<name>[A-Z]{2,}(?:['-][A-Z]+)*(?:[ \t]+(?:[A-Z]\.|[A-Z]{2,}(?:['-][A-Z]+)*)){0,2})\b".to_string()),
            // Credentials: "Ana Ruiz, MD", "Ana Ruiz MD" (but "Duchenne MD" is a dystrophy).
            re(format!(
                r"{name},[ \t]*{CREDENTIAL}\b(?P<zip>[ \t]+\d{{5}})?"
            )),
            re(format!(
                r"(?P<name>{WORD}(?:[ \t]+(?:[A-Z]\.|{WORD})){{1,3}})[ \t]+{CREDENTIAL}\b(?P<zip>[ \t]+\d{{5}})?"
            )),
            // Relatives named in passing: "her daughter, Maria Lopez,".
            re(format!(
                r"(?i:\b(?:his|her|their|the\s+patient's|patient's|pt's|a|whose)\s+(?:wife|husband|daughter|son|mother|father|sister|brother|spouse|partner|friend|caregiver|niece|nephew|granddaughter|grandson|grandmother|grandfather|aunt|uncle|cousin|neighbor|neighbour|fiancée?|boyfriend|girlfriend),?[ \t]+){titled}"
            )),
            // Signature blocks: a name alone on the line after a closing or a dash.
            re(format!(
                r"(?i:\b(?:sincerely|regards|respectfully|thank\s+you),?[ \t]*\r?\n[ \t]*){name}"
            )),
            re(format!(r"(?m:^[ \t]*(?:--|—|/s/)[ \t]*){name}")),
        ];
        Self {
            first: lowercase_set(FIRST_NAMES),
            common_word_first: lowercase_set(COMMON_WORD_FIRST_NAMES),
            contexts,
            word: Regex::new(WORD).expect("word pattern compiles"),
            eponym: Regex::new(&format!(
                r"\b((?:{WORD}[ \t]+){{0,2}}{WORD})(?:['’]s|['’])?[ \t-]+(?i:{EPONYM_HEADS})\b"
            ))
            .expect("eponym pattern compiles"),
        }
    }

    /// Byte ranges of every name in `text`, found and propagated, sorted and disjoint.
    pub fn find(&self, text: &str) -> Vec<Range<usize>> {
        let mut found: Vec<Range<usize>> = Vec::new();
        for re in &self.contexts {
            // "Bethesda, MD 20892" is a place: a credential is not followed by a ZIP code.
            for c in re.captures_iter(text).filter(|c| c.name("zip").is_none()) {
                found.push(c.name("name").expect("a name group").range());
            }
        }
        // A disease's namesake ("Parkinson" where the text says "Parkinson disease") is a
        // public figure, not a patient: never found by the gazetteer, never propagated.
        let eponyms = self.eponyms(text);
        found.extend(self.gazetteer_names(text, &eponyms));
        let parts = self.name_parts(text, &found, &eponyms);
        found.extend(self.occurrences(text, &parts));
        merge(found)
    }

    /// The eponym words of `text`, whole and by their hyphenated pieces ("epstein-barr",
    /// "epstein", "barr").
    fn eponyms(&self, text: &str) -> HashSet<String> {
        let mut out = HashSet::new();
        for c in self.eponym.captures_iter(text) {
            for word in c[1].split([' ', '\t']).map(stem) {
                out.extend(word.split('-').map(str::to_string));
                out.insert(word);
            }
        }
        out
    }

    /// "First Last" where First is in the first-name list (and no everyday word) and Last looks
    /// like a surname.
    fn gazetteer_names(&self, text: &str, eponyms: &HashSet<String>) -> Vec<Range<usize>> {
        let words: Vec<Range<usize>> = self.word.find_iter(text).map(|m| m.range()).collect();
        let mut out = Vec::new();
        for pair in words.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let gap = &text[a.end..b.start];
            let joined = gap == " " || gap == "\t";
            if !joined || is_placeholder(text, a) || is_placeholder(text, b) {
                continue;
            }
            let (first, last) = (stem(&text[a.clone()]), stem(&text[b.clone()]));
            let is_first = self.first.contains(&first) && !self.common_word_first.contains(&first);
            let is_last = !NOT_SURNAMES.contains(&last.as_str())
                && !self.common_word_first.contains(&last)
                && !eponyms.contains(&first)
                && !eponyms.contains(&last);
            if is_first && is_last {
                out.push(a.start..b.end);
            }
        }
        out
    }

    /// The words of the found names worth looking for elsewhere in the document.
    fn name_parts(
        &self,
        text: &str,
        found: &[Range<usize>],
        eponyms: &HashSet<String>,
    ) -> Vec<String> {
        let mut parts: Vec<String> = found
            .iter()
            .flat_map(|r| self.word.find_iter(&text[r.clone()]))
            .map(|m| m.as_str().to_string())
            .filter(|w| {
                let lower = stem(w);
                w.len() >= 2 && !NEVER_PARTS.contains(&lower.as_str()) && !eponyms.contains(&lower)
            })
            .collect();
        parts.sort();
        parts.dedup();
        parts
    }

    /// Every whole-word occurrence of a part, as written, in Title case or in capitals.
    fn occurrences(&self, text: &str, parts: &[String]) -> Vec<Range<usize>> {
        if parts.is_empty() {
            return Vec::new();
        }
        let mut variants: Vec<String> = parts
            .iter()
            .flat_map(|p| [p.clone(), title_case(p), p.to_uppercase()])
            .map(|v| regex::escape(&v))
            .collect();
        variants.sort();
        variants.dedup();
        let re =
            Regex::new(&format!(r"\b(?:{})\b", variants.join("|"))).expect("escaped names compile");
        re.find_iter(text)
            .map(|m| m.range())
            .filter(|r| !is_placeholder(text, r))
            .collect()
    }
}

impl Default for NameFinder {
    fn default() -> Self {
        Self::new()
    }
}

/// A word in lower case without a possessive: "Gehrig's" → "gehrig".
fn stem(word: &str) -> String {
    let lower = word.to_lowercase();
    lower
        .strip_suffix("'s")
        .or_else(|| lower.strip_suffix("’s"))
        .unwrap_or(&lower)
        .to_string()
}

/// Inside a placeholder or section header such as `[NAME]` or `[HISTORY]`.
fn is_placeholder(text: &str, r: &Range<usize>) -> bool {
    text[..r.start].ends_with('[') && text[r.end..].starts_with(']')
}

fn title_case(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(c) => c
            .to_uppercase()
            .chain(chars.flat_map(char::to_lowercase))
            .collect(),
        None => String::new(),
    }
}

/// Sorted, with overlapping or touching ranges joined.
fn merge(mut ranges: Vec<Range<usize>>) -> Vec<Range<usize>> {
    ranges.sort_by_key(|r| (r.start, r.end));
    let mut out: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(text: &str) -> Vec<&str> {
        NameFinder::new()
            .find(text)
            .into_iter()
            .map(|r| &text[r])
            .collect()
    }

    #[test]
    fn contexts_gazetteer_and_propagation() {
        assert_eq!(
            names("Patient: Quentaro Vashti\nDOB: x"),
            ["Quentaro Vashti"]
        );
        assert_eq!(
            names("Discharge summary for Maria Gonzalez. Ms. Gonzalez improved."),
            ["Maria Gonzalez", "Gonzalez"]
        );
        assert_eq!(names("her daughter, Zelnick Orr, called"), ["Zelnick Orr"]);
        assert_eq!(
            names("Reviewed with Kevin Brennan today."),
            ["Kevin Brennan"]
        );
        assert_eq!(names("Sincerely,\nOdalys Prentiss"), ["Odalys Prentiss"]);
        assert_eq!(names("Ana Q. Ruiz, MD"), ["Ana Q. Ruiz"]);
    }

    #[test]
    fn eponyms_and_common_words_are_not_names() {
        for text in [
            "Addison Disease is rare.",
            "Will Medicare pay for it?",
            "Grace Period applies to refills.",
            "Parkinson disease and Down syndrome; Hodgkin lymphoma.",
            "[HISTORY] [NAME]",
        ] {
            assert!(names(text).is_empty(), "{text}: {:?}", names(text));
        }
    }
}
