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

pub(crate) const FIRST_NAMES: &str = include_str!("../../corpora/names/first-names.txt");
/// First names that are also everyday words ("Hope", "Will", "Grace"): the gazetteer leaves
/// them to the context rules.
pub(crate) const COMMON_WORD_FIRST_NAMES: &str =
    include_str!("../../corpora/names/common-word-first-names.txt");
pub(crate) const LAST_NAMES: &str = include_str!("../../corpora/names/last-names.txt");

/// A name-shaped word: Title case or capitals, any script's letters, with O'Brien /
/// Smith-Jones / McDonald / Muñoz forms.
const WORD: &str = r"\p{Lu}\p{L}*(?:['’-]\p{L}+)*";
/// One to four name words on one line ("Ana Q. Ruiz").
const RUN: &str =
    r"\p{Lu}\p{L}*(?:['’-]\p{L}+)*(?:[ \t]+(?:\p{Lu}\.|\p{Lu}\p{L}*(?:['’-]\p{L}+)*)){0,3}";
/// "Last, First" and "LAST,FIRST" (VistA).
const LAST_FIRST: &str =
    r"\p{Lu}\p{L}*(?:['’-]\p{L}+)*,[ \t]*\p{Lu}\p{L}*(?:['’-]\p{L}+)*(?:[ \t]+\p{Lu}\.)?";

/// Labels a name follows after a colon (or a spaced dash): "Patient: ", "Attending - ".
/// Family-history and chief-complaint labels ("Mother:", "CC:") introduce conditions, not
/// people, and are left out.
const NAME_LABELS: &str = r"patient(?:'s)?\s+name|patient|pt|name|full\s+name|attending(?:\s+physician)?|physician|pcp|primary\s+care(?:\s+physician)?|referring(?:\s+physician)?|surgeon|resident|author|emergency\s+contact|next\s+of\s+kin|contact\s+person|guarantor|spouse|informant|interpreter|caregiver|witness";
/// Phrases a name follows directly: "Discharge summary for ", "Electronically signed by ".
const NAME_PHRASES: &str = r"discharge\s+summary\s+for|summary\s+for|note\s+for|seen\s+by|examined\s+by|referred\s+by|(?:electronically\s+)?signed(?:\s+by)?|dictated\s+by|transcribed\s+by|cosigned\s+by|attended\s+by|dear";
const RELATIVES: &str = r"wife|husband|daughter|son|mother|father|sister|brother|spouse|partner|friend|caregiver|niece|nephew|granddaughter|grandson|grandmother|grandfather|aunt|uncle|cousin|neighbor|neighbour|fiancée?|boyfriend|girlfriend";

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
    "boulevard",
    "highway",
    "parkway",
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

/// Street words that are surnames too ("Erica Way", "Tom Lane"): a name unless a house
/// number comes first ("12 Erica Way").
const STREET_SURNAMES: &[&str] = &["road", "lane", "drive", "court", "place", "way", "square"];

/// Words that make the capitalised word before them an eponym.
/// Only words that name a condition: a generic word ("type", "test", "score") after a
/// patient's name would otherwise make the name an eponym and let it through.
const EPONYM_HEADS: &str = "diseases?|syndromes?|disorders?|palsy|tumou?r|anomaly|phenomenon|reflex|lymphoma|sarcoma|dementia|chorea|ataxia|dystrophy|atrophy|arthritis|ulcer|encephalopathy|neuropathy|neuralgia|virus|cyst|deformity|anemia|leukemia|myopathy|thyroiditis";

/// Words around names that are never name parts themselves.
/// Compared as written: the credential "PA" is no name part, the surname "Pa" is.
const NEVER_PARTS: &[&str] = &[
    "Dr", "DR", "Mr", "MR", "Mrs", "MRS", "Ms", "MS", "Miss", "MISS", "Mx", "Prof", "PROF",
    "Doctor", "Nurse", "MD", "DO", "RN", "NP", "PA", "PhD", "Patient", "PATIENT", "Name", "NAME",
    "The", "And", "Of", "For", "By", "Jr", "Sr", "II", "III",
];

pub struct NameFinder {
    first: HashSet<String>,
    /// First names and surnames: what a capital title must be followed by.
    listed: HashSet<String>,
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
        let name = format!(r"(?P<name>{LAST_FIRST}|{RUN})");
        // A title after a label belongs to the context, not to the name: "Seen by Dr. Ruiz".
        let titled = format!(r"(?:{TITLE}\.?[ \t]+)?{name}");
        let contexts = vec![
            re(format!(
                r"(?i:\b(?:{NAME_LABELS})(?:[ \t]*:[ \t]*|[ \t]+[-–][ \t]+)|\b(?:{NAME_PHRASES})[ \t]*:?[ \t]+){titled}"
            )),
            // Titles: "Dr. Ruiz" (not "Dr. Patel, Cardiology": no "Last, First" after a title).
            re(format!(r"\b{TITLE}\.?[ \t]+(?P<name>{RUN})")),
            // Capital titles ("MR. SMITH") count only before a listed name: "MR AND TR" is
            // mitral and tricuspid regurgitation, "MS. MRI" ends a sentence.
            re(r"\b(?:DR|MR|MRS|MS|MISS|PROF)\.?[ \t]+(?P<listed>\p{Lu}{2,}(?:['-]\p{Lu}+)*(?:[ \t]+(?:\p{Lu}\.|\p{Lu}{2,}(?:['-]\p{Lu}+)*)){0,2})\b".to_string()),
            // Credentials: "Ana Ruiz, MD", "Ana Ruiz MD" (but "Duchenne MD" is a dystrophy).
            re(format!(r"{name},[ \t]*{CREDENTIAL}\b(?P<zip>[ \t]+\d{{5}})?")),
            re(format!(
                r"(?P<name>{WORD}(?:[ \t]+(?:\p{{Lu}}\.|{WORD})){{1,3}})[ \t]+{CREDENTIAL}\b(?P<zip>[ \t]+\d{{5}})?"
            )),
            // Relatives named in passing: "her daughter, Maria Lopez,".
            re(format!(
                r"(?i:\b(?:his|her|their|the\s+patient's|patient's|pt's|whose)\s+(?:{RELATIVES}),?[ \t]+){titled}"
            )),
            // Signature blocks: a name alone on the line after a closing or a dash.
            re(format!(
                r"(?i:\b(?:sincerely|regards|respectfully|thank\s+you),?[ \t]*\r?\n[ \t]*){name}"
            )),
            re(format!(r"(?m:^[ \t]*(?:--|—|/s/)[ \t]*){name}")),
        ];
        let first = lowercase_set(FIRST_NAMES);
        Self {
            listed: first
                .iter()
                .cloned()
                .chain(lowercase_set(LAST_NAMES))
                .collect(),
            first,
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
                match (c.name("name"), c.name("listed")) {
                    (Some(m), _) => found.push(m.range()),
                    (None, Some(m)) if self.starts_with_listed(m.as_str()) => found.push(m.range()),
                    _ => {}
                }
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

    fn starts_with_listed(&self, name: &str) -> bool {
        let first = name.split([' ', '\t']).next().unwrap_or_default();
        self.listed.contains(&stem(first)) && !self.common_word_first.contains(&stem(first))
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
            let first = stem(&text[a.clone()]);
            if !self.first.contains(&first) || self.common_word_first.contains(&first) {
                continue;
            }
            // Two capitals are a state or a credential ("Savannah GA", "Ana RN"), not a surname.
            let raw_last = &text[b.clone()];
            if raw_last.len() == 2 && raw_last.chars().all(|c| c.is_ascii_uppercase()) {
                continue;
            }
            let last = stem(raw_last);
            let street = STREET_SURNAMES.contains(&last.as_str())
                && text[..a.start]
                    .trim_end()
                    .ends_with(|c: char| c.is_ascii_digit());
            let is_last = !NOT_SURNAMES.contains(&last.as_str())
                && !street
                && !eponyms.contains(&first)
                && !eponyms.contains(&last);
            if is_last {
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
                // A two-letter part ("To", "Li") is looked for even where it is also a word:
                // a sentence-initial "To" redacted costs less than a surname left standing.
                w.len() >= 2
                    && !NEVER_PARTS.contains(&w.as_str())
                    && !eponyms.contains(&lower)
                    && (w.chars().count() <= 2 || !used_as_a_word(text, &lower))
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

/// The document also writes `lower` in lower case as a word ("chest", "brain"): a word the
/// name rules mistook for a name, not a name to look for everywhere.
fn used_as_a_word(text: &str, lower: &str) -> bool {
    is_whole_word_in(text, lower)
}

/// `word` appears in `text` as a whole word (not inside a longer word or number).
pub(crate) fn is_whole_word_in(text: &str, word: &str) -> bool {
    let is_letter = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    text.match_indices(word).any(|(i, _)| {
        !is_letter(text[..i].chars().next_back())
            && !is_letter(text[i + word.len()..].chars().next())
    })
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
    fn formats_found_in_the_wild() {
        assert_eq!(names("Patient: José Muñoz"), ["José Muñoz"]);
        assert_eq!(names("PATIENT: VASHTI,QUENTARO"), ["VASHTI,QUENTARO"]);
        assert_eq!(names("Patient Name - Vashti"), ["Vashti"]);
        assert_eq!(names("MR. JOHNSON was seen"), ["JOHNSON"]);
        // A generic word after a name does not make it an eponym.
        assert_eq!(
            names("Kevin Brennan type 2 DM on metformin. Brennan reports"),
            ["Kevin Brennan", "Brennan"]
        );
    }

    #[test]
    fn clinical_words_after_labels_and_capital_titles_stay() {
        for text in [
            "CC: Chest pain. Mother: Breast cancer. Father: MI at 60.",
            "MODERATE MR AND TR. HX OF MS. MRI BRAIN normal.",
        ] {
            assert!(names(text).is_empty(), "{text}: {:?}", names(text));
        }
        // A title's name is not "Last, First", and a word the note also writes in lower case
        // is not looked for elsewhere.
        assert_eq!(
            names("Dr. Patel, Cardiology. Cardiology clinic follow-up."),
            ["Patel"]
        );
        assert_eq!(
            names("Seen by Dr. Chest. Chest pain, chest tightness."),
            ["Chest"]
        );
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
