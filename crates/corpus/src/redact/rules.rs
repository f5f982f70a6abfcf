//! The pattern rules: structured identifiers, places smaller than a state, and ages over 89.
//! Each rule is a regex whose optional groups `pre` and `post` are kept around the placeholder
//! ("MRN: [MRN]", "[LOCATION], IL"), and a check that can turn a match down.

use regex::{Captures, Regex};

use super::Phi;

pub struct Rule {
    pub phi: Phi,
    pub re: Regex,
    /// Turns a match down (kept as written) when it returns false.
    pub accept: fn(&Captures) -> bool,
}

const PHONE: &str = r"(?:\+?1[\s.-]?)?(?:\(\d{3}\)\s?|\b\d{3}[\s.-])\d{3}[\s.-]\d{4}\b(?:\s*(?:x|ext\.?)\s*\d{1,5}\b)?";
/// An identifier after a label: letters, digits and dashes, with at least one digit (checked).
const ID: &str = r"[A-Za-z0-9][A-Za-z0-9-]{3,24}\b";
const STATES: &str = r"Alabama|Alaska|Arizona|Arkansas|California|Colorado|Connecticut|Delaware|Florida|Georgia|Hawaii|Idaho|Illinois|Indiana|Iowa|Kansas|Kentucky|Louisiana|Maine|Maryland|Massachusetts|Michigan|Minnesota|Mississippi|Missouri|Montana|Nebraska|Nevada|New Hampshire|New Jersey|New Mexico|New York|North Carolina|North Dakota|Ohio|Oklahoma|Oregon|Pennsylvania|Rhode Island|South Carolina|South Dakota|Tennessee|Texas|Utah|Vermont|Virginia|Washington|West Virginia|Wisconsin|Wyoming";
const STATE_CODES: &str = r"AL|AK|AZ|AR|CA|CO|CT|DE|DC|FL|GA|HI|ID|IL|IN|IA|KS|KY|LA|ME|MD|MA|MI|MN|MS|MO|MT|NE|NV|NH|NJ|NM|NY|NC|ND|OH|OK|OR|PA|RI|SC|SD|TN|TX|UT|VT|VA|WA|WV|WI|WY";
const STREET_SUFFIX: &str = r"(?i:street|st|avenue|ave|road|rd|boulevard|blvd|lane|ln|drive|dr|court|ct|place|pl|way|terrace|ter|circle|cir|parkway|pkwy|highway|hwy|square|sq|trail|trl|loop|alley|plaza|pike|crescent)";
/// One to three place words: "Springfield", "Fort Collins", "Winston-Salem", "St. Louis".
const PLACE: &str = r"(?:St\.[ \t]+)?(?:[A-Z][a-z][A-Za-z'-]*|[A-Z]{3,})(?:[ \t](?:[A-Z][a-z][A-Za-z'-]*|[A-Z]{3,})){0,2}";

fn always(_: &Captures) -> bool {
    true
}

/// "Springfield, IL" is a city; "Abdominal Ultrasound, CT scan" is not, nor is "Disease
/// Research Center, Washington" (an institution).
fn is_city(c: &Captures) -> bool {
    // "CT" is the one code that routinely follows a capitalised word and a comma in
    // clinical text ("Chest X-Ray, CT scan"); "Portland, OR yesterday" is a city.
    const AMBIGUOUS: &[&str] = &["CT"];
    const INSTITUTION: &[&str] = &[
        "disease",
        "diseases",
        "research",
        "center",
        "centre",
        "university",
        "institute",
        "hospital",
        "clinic",
        "foundation",
        "association",
        "society",
        "school",
        "college",
        "department",
        "medicine",
        "health",
        "program",
        "library",
        "office",
    ];
    let place = c.name("place").map_or("", |m| m.as_str());
    let code = c
        .name("post")
        .map_or("", |m| m.as_str().trim_start_matches([',', ' ', '\t']));
    let ambiguous = AMBIGUOUS.contains(&code) && c.name("next").is_some();
    !ambiguous
        && !place
            .split([' ', '\t'])
            .any(|w| INSTITUTION.contains(&w.to_ascii_lowercase().as_str()))
}

fn url_has_identifier(c: &Captures) -> bool {
    let url = c[0].trim_end_matches(['.', ',', ';', ':', '!', '?']);
    let lower = url.to_ascii_lowercase();
    lower.contains('?')
        || lower.contains("patient")
        || lower.contains("mrn")
        || url
            .split(|c: char| !c.is_ascii_digit())
            .any(|run| run.len() >= 5)
}

fn valid_ipv4(c: &Captures) -> bool {
    c[0].split('.').all(|o| o.parse::<u8>().is_ok())
}

/// A labelled identifier rule: one or more `labels` (case-insensitive, "device serial"), then
/// either "number/no/#/identifier/id" or a colon and a value with a digit, or a bare label and
/// a value shaped like an identifier by itself (`accept`: "VIN 1HGCM82633A004352", "Acct
/// 12345678", but not "serial CA-125 levels" or "age group 18-64"); either may say "is" or
/// "was" first. `before_id` may take a word kept before the identifier (a plate's state).
fn labelled(phi: Phi, labels: &str, before_id: &str, accept: fn(&Captures) -> bool) -> Rule {
    Rule {
        phi,
        re: Regex::new(&format!(
            r"(?i)(?P<pre>\b(?:{labels})(?:[ \t]+(?:{labels}))*(?:(?P<sep>[ \t]*(?:number|num|no\.?|#|identifier|id)[ \t]*[:#]?|[ \t]*[:#])[ \t]*|[ \t]+)(?:(?:is|was)[ \t]+)?{before_id}){ID}"
        ))
        .expect("labelled rule compiles"),
        accept,
    }
}

/// After "number", "#" or a colon, any value with a digit; after the bare label, one that
/// `bare` says is shaped like an identifier.
fn labelled_value(c: &Captures, bare: fn(&str) -> bool) -> bool {
    let label = c.name("pre").map_or(0, |m| m.len());
    let value = &c[0][label..];
    match c.name("sep") {
        Some(_) => value.bytes().any(|b| b.is_ascii_digit()),
        None => bare(value),
    }
}

fn labelled_identifier(c: &Captures) -> bool {
    labelled_value(c, looks_like_identifier)
}

fn labelled_plate(c: &Captures) -> bool {
    labelled_value(c, |v| looks_like_identifier(v) || looks_like_a_plate(v))
}

/// A value that is an identifier without a label saying so: seven or more digits
/// ("12345678"), or four or more with a capital letter ("4ABC123", "SN-99812-A",
/// "S12345678"). Not a range ("18-64"), a year, a count ("250000"), a billing code ("99214"),
/// a marker or variant ("CA-125", "CA19-9", "V600E"), a model ("670G"), a term ("COVID-19"),
/// or a number spelt with a word ("1-800-MEDICARE").
fn looks_like_identifier(value: &str) -> bool {
    let digits = value.bytes().filter(u8::is_ascii_digit).count();
    let capital = value.bytes().any(|b| b.is_ascii_uppercase());
    let longest_word = value
        .split(|c: char| !c.is_ascii_alphabetic())
        .map(str::len)
        .max()
        .unwrap_or(0);
    longest_word < 6 && (digits >= 7 || (digits >= 4 && capital))
}

/// A licence plate after "plate"/"VIN": shorter, three digits with capitals ("7XYZ21").
fn looks_like_a_plate(value: &str) -> bool {
    let digits = value.bytes().filter(u8::is_ascii_digit).count();
    let capitals = value.bytes().filter(u8::is_ascii_uppercase).count();
    digits >= 3 && capitals >= 2
}

fn rule(phi: Phi, pattern: &str, accept: fn(&Captures) -> bool) -> Rule {
    Rule {
        phi,
        re: Regex::new(pattern).expect("rule compiles"),
        accept,
    }
}

/// The rules in the order they run: most specific first (a fax is a phone number with a label;
/// a street address holds numbers a bare-number rule would take).
pub fn rules() -> Vec<Rule> {
    vec![
        rule(
            Phi::Email,
            r"(?i)\b[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}\b",
            always,
        ),
        rule(
            Phi::Url,
            r#"(?i)\b(?:https?://|www\.)[^\s<>"'\])]+"#,
            url_has_identifier,
        ),
        rule(Phi::Ip, r"\b(?:\d{1,3}\.){3}\d{1,3}\b", valid_ipv4),
        rule(
            Phi::Ip,
            r"(?i)\b(?:[0-9a-f]{1,4}:){7}[0-9a-f]{1,4}\b|\b(?:[0-9a-f]{1,4}:){1,6}:[0-9a-f]{0,4}\b",
            always,
        ),
        rule(
            Phi::Mrn,
            r"(?i)(?P<pre>\b(?:mrn|mr\s*#|med(?:ical)?\.?\s+rec(?:ord)?\.?(?:\s*(?:number|no\.?|#))?|record\s+(?:number|no\.?|#)|patient\s+id|chart\s+(?:number|no\.?|#))\s*[:#]?\s*)[a-z]{0,3}-?\d{4,12}\b",
            always,
        ),
        rule(
            Phi::Ssn,
            r"(?i)\b\d{3}-\d{2}-\d{4}\b|(?P<pre>(?:\bssn|\bss\s*#|\bsocial\s+security(?:\s+(?:number|no\.?|#))?)\s*[:#]?\s*)\d{3}[ -]?\d{2}[ -]?\d{4}\b",
            always,
        ),
        labelled(
            Phi::HealthPlan,
            r"health\s+plan(?:\s+beneficiary)?|beneficiary|member|subscriber|policy|insurance|insurance\s+policy|medicaid|medicare|group",
            "",
            labelled_identifier,
        ),
        labelled(
            Phi::Account,
            r"account|acct\.?|billing\s+account|invoice|encounter",
            "",
            labelled_identifier,
        ),
        labelled(
            Phi::License,
            r"(?:driver'?s\s+)?licen[cs]e|dea|npi|certificate|certification|board\s+certification",
            "",
            labelled_identifier,
        ),
        labelled(
            Phi::Vehicle,
            r"vin|vehicle(?:\s+identification)?|license\s+plate|plate",
            // "Plate number MA 7XYZ21": the state stays, as everywhere.
            &format!(r"(?:(?-i:{STATE_CODES})[ \t]+)?"),
            labelled_plate,
        ),
        labelled(
            Phi::Device,
            r"serial|device|udi|implant(?:\s+serial)?|pacemaker\s+serial|lot|s/n",
            "",
            labelled_identifier,
        ),
        rule(
            Phi::Fax,
            &format!(
                r"(?i)(?P<pre>\b(?:fax|facsimile)(?:\s*(?:number|no\.?|#))?\s*[:.]?\s*)(?:{PHONE}|\+?1?\d{{10}}\b|\d{{3}}[-.]\d{{4}}\b)"
            ),
            always,
        ),
        rule(Phi::Phone, PHONE, always),
        // Digits only after a label: "Phone: 18005551234", "TTY: 7315554284".
        rule(
            Phi::Phone,
            r"(?i)(?P<pre>\b(?:phone|tel|telephone|tty|cell|mobile|pager|home|work|call)[ \t]*[:#]?[ \t]*)(?:\+?1?\d{10}|\d{3}[-.]\d{4})\b",
            always,
        ),
        // International: "+44 20 7946 0958".
        rule(Phi::Phone, r"\+\d{1,3}(?:[ .-]\d{1,4}){2,5}\b", always),
        rule(
            Phi::Address,
            &format!(
                r"\b\d{{1,6}}[A-Z]?[ \t]+(?:(?:[NSEW]|NE|NW|SE|SW|North|South|East|West)\.?[ \t]+)?(?:(?:[A-Z][A-Za-z'-]*|\d+(?:st|nd|rd|th))\.?[ \t]+){{1,4}}{STREET_SUFFIX}\b\.?(?:,?[ \t]*(?i:apt|apartment|suite|ste|unit|room|rm|floor|fl|#)\.?[ \t]*#?[A-Za-z0-9-]+)?"
            ),
            always,
        ),
        rule(Phi::Address, r"(?i)\bp\.?\s?o\.?\s+box\s+\d+", always),
        // A unit written before its street: "Apt 4B, 221 Baker St".
        rule(
            Phi::Address,
            r"\b(?i:apt|apartment|suite|ste|unit)\.?[ \t]*#?[ \t]*[A-Za-z0-9-]*\d[A-Za-z0-9-]*\b",
            always,
        ),
        rule(
            Phi::Address,
            // A whole "Address:" line, when it starts the line ("Issues to address: pain" is
            // a plan, not an address).
            r"(?im)(?P<pre>^[ \t]*(?:home\s+|mailing\s+|street\s+|patient\s+)?address[ \t]*:[ \t]*)[^\n]+",
            always,
        ),
    ]
}

/// Places, run after names (so "Ana Ruiz, MD" is a name before "X, MD" could be a place).
pub fn place_rules() -> Vec<Rule> {
    vec![
        // Springfield, IL 62704 / Fort Collins, Colorado: the city goes, the state stays.
        rule(
            Phi::Location,
            &format!(
                r"\b(?P<place>{PLACE})(?P<post>,[ \t]*(?:{STATES}|(?:{STATE_CODES})\b))(?P<next>[ \t]+[a-z]+)?"
            ),
            is_city,
        ),
        // Without the comma, before a state code and a ZIP: "Springfield IL 62704".
        rule(
            Phi::Location,
            &format!(
                r"\b(?P<place>{PLACE})(?P<post>[ \t]+(?:{STATE_CODES})[ \t]+\d{{5}}(?:-\d{{4}})?\b)"
            ),
            is_city,
        ),
        // "lives in Springfield", "moved here from Fort Collins"
        rule(
            Phi::Location,
            &format!(
                r"(?P<pre>(?i:\b(?:lives|living|resides|residing|resident|moved(?:\s+here)?|relocated|born|hometown|travell?ed|visiting|grew\s+up|stays|staying)(?:\s+(?:in|to|from|of|at))?:?)[ \t]+){PLACE}"
            ),
            always,
        ),
        rule(
            Phi::Location,
            &format!(
                r"(?P<pre>(?i:\b(?:city|town|county|hometown|birthplace|place\s+of\s+birth))[ \t]*:[ \t]*){PLACE}"
            ),
            always,
        ),
        rule(
            Phi::Location,
            r"\b[A-Z][a-z]+(?:[ \t]+[A-Z][a-z]+)?[ \t]+(?:County|Parish|Township|Borough)\b",
            always,
        ),
        // ZIP codes: after a state, after a label, or in ZIP+4 form anywhere.
        rule(
            Phi::Zip,
            &format!(
                r"(?P<pre>\b(?:{STATE_CODES}|{STATES}|\[LOCATION\])[ \t]+)\d{{5}}(?:-\d{{4}})?\b"
            ),
            always,
        ),
        rule(
            Phi::Zip,
            r"(?i)(?P<pre>\b(?:zip(?:\s*code)?|postal\s+code)[ \t]*[:#]?[ \t]*)\d{5}(?:-\d{4})?\b",
            always,
        ),
        rule(Phi::Zip, r"\b\d{5}-\d{4}\b", always),
    ]
}

/// Ages over 89 (Safe Harbor folds them into "90 or older"): the number becomes `[AGE]`.
pub fn age_rules() -> Vec<Rule> {
    const AGE: &str = r"(?:9\d|1[0-2]\d)";
    vec![
        rule(
            Phi::Age,
            &format!(
                r"\b{AGE}(?P<post>(?:[ \t]*-?[ \t]*(?i:years?|yrs?|y)[ \t]*-?[ \t]*(?i:old|of\s+age|o))|[ \t]*(?i:y/o|yo|year-old|yr-old)\b|[ \t]*(?i:y\.o\.))"
            ),
            always,
        ),
        rule(
            Phi::Age,
            &format!(r"(?P<pre>(?i:\bage[ds]?|\baged)[ \t]*:?[ \t]*){AGE}\b"),
            always,
        ),
    ]
}
