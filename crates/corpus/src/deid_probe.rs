//! The Safe Harbor probe: synthetic clinical notes with planted identifiers of every
//! category, made from a seed, and the count of what survives redaction. Also the other side
//! of the ledger: what redaction wrongly takes out of real medical text (MedQuAD), eponyms
//! such as "Parkinson" or "Down syndrome" first.
//!
//! Names are drawn from the shipped Census lists and, for a third of the surnames, invented
//! (syllables no list holds), so the context rules are tested apart from the gazetteer.

use std::collections::BTreeMap;

use regex::Regex;

use crate::redact::{Phi, Redactor};

use crate::redact::names::{COMMON_WORD_FIRST_NAMES, FIRST_NAMES, LAST_NAMES};

/// One planted identifier: none of `parts` may survive redaction.
#[derive(Debug, Clone)]
pub struct Planted {
    pub phi: Phi,
    pub parts: Vec<String>,
}

pub struct ProbeNote {
    pub text: String,
    pub planted: Vec<Planted>,
}

/// A small deterministic generator (SplitMix64): the probe set is a pure function of its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        lab_data::sampler::splitmix64(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T: AsRef<str> + ?Sized>(&mut self, xs: &'a [&'a T]) -> &'a str {
        xs[self.below(xs.len() as u64) as usize].as_ref()
    }
    fn digits(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b'0' + self.below(10) as u8))
            .collect()
    }
}

const CITIES: &[&str] = &[
    "Springfield",
    "Fort Collins",
    "Winston-Salem",
    "Ann Arbor",
    "Tacoma",
    "Duluth",
    "Bozeman",
    "Lancaster",
    "Pasadena",
    "Savannah",
    "Cedar Rapids",
    "Flagstaff",
    "Elmira",
    "Yakima",
];
const STATES: &[(&str, &str)] = &[
    ("IL", "Illinois"),
    ("CO", "Colorado"),
    ("NC", "North Carolina"),
    ("MI", "Michigan"),
    ("WA", "Washington"),
    ("MN", "Minnesota"),
    ("MT", "Montana"),
    ("PA", "Pennsylvania"),
    ("CA", "California"),
    ("GA", "Georgia"),
    ("IA", "Iowa"),
    ("AZ", "Arizona"),
];
const STREETS: &[&str] = &[
    "Oak",
    "Maple",
    "Elm Grove",
    "Chestnut",
    "Lincoln",
    "Cedar Hill",
    "Pine",
    "Lakeview",
    "Sunset",
    "Main",
    "Highland",
    "5th",
    "Riverside",
    "Old Mill",
];
const SUFFIXES: &[&str] = &[
    "Street",
    "St.",
    "Avenue",
    "Ave",
    "Road",
    "Rd.",
    "Boulevard",
    "Lane",
    "Drive",
    "Court",
    "Place",
    "Way",
    "Terrace",
];
const MONTHS: &[&str] = &[
    "January", "Feb", "March", "Apr.", "May", "June", "Jul", "August", "Sept", "October", "Nov",
    "December",
];
const FILLER: &[&str] = &[
    "Chest pain radiating to the left arm, relieved by rest.",
    "Stable angina; ECG without acute changes.",
    "Start aspirin 81 mg daily and atorvastatin 40 mg at night.",
    "History of type 2 diabetes mellitus and hypertension.",
    "Parkinson disease diagnosed several years ago, on carbidopa-levodopa.",
    "No evidence of Hodgkin lymphoma on the last scan.",
    "Mother had Alzheimer disease; a brother has Down syndrome.",
    "Lungs clear to auscultation bilaterally.",
    "Follow up in clinic in two weeks with repeat labs.",
    "Denies fever, chills or night sweats.",
];

/// The people a note talks about.
struct Cast {
    first: Vec<&'static str>,
    plain_first: Vec<&'static str>,
    last: Vec<&'static str>,
}

fn lines(text: &'static str) -> Vec<&'static str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect()
}

impl Cast {
    fn new() -> Self {
        let common: Vec<&str> = lines(COMMON_WORD_FIRST_NAMES);
        // The lists hold a few titles as names ("Nurse", "Miss"): those read as titles.
        let titles = ["Nurse", "Miss", "Doctor", "Patient"];
        let first: Vec<&str> = lines(FIRST_NAMES)
            .into_iter()
            .filter(|f| !titles.contains(f))
            .collect();
        let plain_first = first
            .iter()
            .copied()
            .filter(|f| !common.contains(f))
            .collect();
        // Surnames that are also state or street names, or the filler's eponyms, would read as
        // leaks of text that is meant to stay.
        let last = lines(LAST_NAMES)
            .into_iter()
            .filter(|l| {
                !titles.contains(l)
                    && !STATES.iter().any(|(_, s)| s.contains(l))
                    && !STREETS.iter().any(|s| s.contains(l))
                    && !FILLER.iter().any(|f| f.contains(l))
            })
            .collect();
        Self {
            first,
            plain_first,
            last,
        }
    }

    /// A patient: one in ten has a name with letters beyond ASCII.
    fn patient(&self, g: &mut Rng) -> (String, String) {
        const FIRST: &[&str] = &[
            "José", "María", "Zoë", "Chloé", "Øystein", "Renée", "Łukasz",
        ];
        const LAST: &[&str] = &[
            "Muñoz",
            "Peña",
            "Núñez",
            "Gómez",
            "Øverland",
            "Lefèvre",
            "Wójcik",
        ];
        if g.below(10) == 0 {
            (g.pick(FIRST).to_string(), g.pick(LAST).to_string())
        } else {
            (g.pick(&self.plain_first).to_string(), self.surname(g))
        }
    }

    fn surname(&self, g: &mut Rng) -> String {
        if g.below(3) == 0 {
            invented_surname(g)
        } else {
            g.pick(&self.last).to_string()
        }
    }
}

/// A surname no list holds: "Quorbelli", "Vantresk".
fn invented_surname(g: &mut Rng) -> String {
    const ONSETS: &[&str] = &["Qu", "V", "Z", "Br", "Th", "Kr", "Osk", "Y", "Dr", "Fl"];
    const MIDDLES: &[&str] = &["or", "an", "el", "ix", "um", "ar", "ev", "ot"];
    const ENDS: &[&str] = &[
        "belli", "tresk", "wick", "ardo", "quist", "enko", "ston", "vak",
    ];
    format!("{}{}{}", g.pick(ONSETS), g.pick(MIDDLES), g.pick(ENDS))
}

/// The probe set: `n` notes from `seed`.
pub fn probe_notes(seed: u64, n: usize) -> Vec<ProbeNote> {
    let cast = Cast::new();
    let mut g = Rng(seed);
    (0..n).map(|_| note(&cast, &mut g)).collect()
}

/// A note: a header naming the patient, then every category in a random order of lines,
/// with clinical filler between them, in one of two letter cases for the header.
fn note(cast: &Cast, g: &mut Rng) -> ProbeNote {
    let mut planted = Vec::new();
    let mut plant = |phi: Phi, parts: Vec<String>| planted.push(Planted { phi, parts });
    let (first, last) = cast.patient(g);
    let header = match g.below(6) {
        0 => format!("Patient: {first} {last}"),
        4 => format!("PATIENT: {},{}", last.to_uppercase(), first.to_uppercase()),
        5 => format!("Patient Name - {first} {last}"),
        1 => format!(
            "PATIENT NAME: {}, {}",
            last.to_uppercase(),
            first.to_uppercase()
        ),
        2 => format!("Discharge summary for {first} {last}"),
        _ => format!(
            "Name: {last}, {first} {}.",
            char::from(b'A' + g.below(26) as u8)
        ),
    };
    let upper = header.starts_with("PATIENT");
    plant(
        Phi::Name,
        if upper {
            vec![first.to_uppercase(), last.to_uppercase()]
        } else {
            vec![first.clone(), last.clone()]
        },
    );
    let mut body: Vec<String> = vec![
        // Propagation: the patient named again without any context.
        format!("{first} reports the pain began after lunch; {last} lives alone."),
        clinician_line(cast, g, &mut plant),
        relative_line(cast, g, &mut plant),
        address_line(g, &mut plant),
        place_line(g, &mut plant),
        date_line(g, &mut plant),
        age_line(g, &mut plant),
        contact_line(g, &mut plant),
        number_line(g, &mut plant),
        network_line(g, &mut plant),
    ];
    plant(Phi::Name, vec![first.clone(), last.clone()]);
    for _ in 0..3 {
        body.push(g.pick(FILLER).to_string());
    }
    shuffle(&mut body, g);
    body.push(signature_line(cast, g, &mut plant));
    ProbeNote {
        text: format!("{header}\n[HISTORY]\n{}\n", body.join("\n")),
        planted,
    }
}

fn shuffle(xs: &mut [String], g: &mut Rng) {
    for i in (1..xs.len()).rev() {
        xs.swap(i, g.below(i as u64 + 1) as usize);
    }
}

type Plant<'a> = dyn FnMut(Phi, Vec<String>) + 'a;

fn clinician_line(cast: &Cast, g: &mut Rng, plant: &mut Plant) -> String {
    let (f, l) = (g.pick(&cast.first).to_string(), cast.surname(g));
    let (line, parts) = match g.below(5) {
        0 => (format!("Seen by Dr. {f} {l} in clinic."), vec![f, l]),
        1 => (format!("Attending: {f} {l}"), vec![f, l]),
        2 => {
            let title = g.pick(&["Dr", "Dr.", "Prof."]);
            (
                format!("Referred by {title} {f} {l} for evaluation."),
                vec![f, l],
            )
        }
        3 => {
            let title = g.pick(&["Mr.", "Mrs.", "Ms.", "Nurse"]);
            (
                format!("Case reviewed with {title} {l}, who agrees."),
                vec![l],
            )
        }
        // In passing, with no context: the gazetteer's job (a first name that is no word).
        _ => {
            let f = g.pick(&cast.plain_first).to_string();
            (
                format!("Discussed with {f} {l} from social work."),
                vec![f, l],
            )
        }
    };
    plant(Phi::Name, parts);
    line
}

fn relative_line(cast: &Cast, g: &mut Rng, plant: &mut Plant) -> String {
    let f = g.pick(&cast.first).to_string();
    let who = g.pick(&[
        "daughter", "son", "wife", "husband", "sister", "brother", "niece",
    ]);
    let owner = g.pick(&["Her", "His", "The patient's"]);
    if g.below(2) == 0 {
        plant(Phi::Name, vec![f.clone()]);
        format!("{owner} {who} {f} is at the bedside.")
    } else {
        let l = cast.surname(g);
        plant(Phi::Name, vec![f.clone(), l.clone()]);
        format!("{owner} {who}, {f} {l}, called with questions.")
    }
}

fn signature_line(cast: &Cast, g: &mut Rng, plant: &mut Plant) -> String {
    let (f, l) = (g.pick(&cast.first).to_string(), cast.surname(g));
    plant(Phi::Name, vec![f.clone(), l.clone()]);
    let initial = char::from(b'A' + g.below(26) as u8);
    match g.below(4) {
        0 => format!("Electronically signed by: {f} {l}, MD"),
        1 => format!("Sincerely,\n{f} {l}"),
        2 => format!("-- {f} {initial}. {l}, RN"),
        _ => format!("{f} {l}, {}", g.pick(&["NP", "PA-C", "DO", "MD"])),
    }
}

fn state(g: &mut Rng) -> (&'static str, &'static str) {
    STATES[g.below(STATES.len() as u64) as usize]
}

fn address_line(g: &mut Rng, plant: &mut Plant) -> String {
    let number = (1 + g.below(9999)).to_string();
    let street = format!("{} {}", g.pick(STREETS), g.pick(SUFFIXES));
    let city = g.pick(CITIES).to_string();
    let (code, _) = state(g);
    let zip = g.digits(5);
    let unit = match g.below(3) {
        0 => format!(
            ", Apt {}{}",
            g.below(40),
            char::from(b'A' + g.below(6) as u8)
        ),
        1 => format!(" Suite {}", 100 + g.below(400)),
        _ => String::new(),
    };
    let mut parts = vec![format!("{number} {street}"), number.clone()];
    parts.extend(
        street
            .split(' ')
            .filter(|w| !SUFFIXES.contains(w))
            .map(str::to_string),
    );
    let unit_id = unit.split(' ').next_back().unwrap_or_default().to_string();
    if !unit.is_empty() {
        parts.push(unit_id.clone());
    }
    plant(Phi::Address, parts);
    match g.below(4) {
        3 if !unit.is_empty() => format!("Unit first: Apt {unit_id}, {number} {street}."),
        0 => {
            plant(Phi::Location, vec![city.clone()]);
            plant(Phi::Zip, vec![zip.clone()]);
            format!("Address: {number} {street}{unit}, {city}, {code} {zip}")
        }
        1 => format!("Home visit at {number} {street}{unit} arranged."),
        _ => {
            let box_no = g.digits(4);
            plant(Phi::Address, vec![format!("Box {box_no}")]);
            format!("Lives at {number} {street}; mail to P.O. Box {box_no}.")
        }
    }
}

fn place_line(g: &mut Rng, plant: &mut Plant) -> String {
    let city = g.pick(CITIES).to_string();
    let (code, name) = state(g);
    let variant = g.below(8);
    let written = if variant == 6 {
        city.to_uppercase()
    } else {
        city.clone()
    };
    plant(Phi::Location, vec![written]);
    match variant {
        5 => format!("Returned from {city}, {code} yesterday."),
        6 => {
            let zip = g.digits(5);
            plant(Phi::Zip, vec![zip.clone()]);
            format!("{} {code} {zip}", city.to_uppercase())
        }
        7 => {
            let zip = g.digits(5);
            plant(Phi::Zip, vec![zip.clone()]);
            format!("Mail: {city} {code} {zip}")
        }
        0 => format!("Lives in {city} with her husband."),
        1 => format!("Moved here from {city}, {name} last year."),
        2 => {
            let zip = format!("{}-{}", g.digits(5), g.digits(4));
            plant(Phi::Zip, vec![zip.clone()]);
            format!("Transferred from {city}, {code} {zip}.")
        }
        3 => {
            let county = g.pick(&["Lincoln", "Orange", "Jefferson", "Marion", "Kent"]);
            plant(Phi::Location, vec![format!("{county} County")]);
            format!("Resides in {city}; {county} County EMS transported.")
        }
        _ => {
            let zip = g.digits(5);
            plant(Phi::Zip, vec![zip.clone()]);
            format!("City: {city}  Zip code: {zip}")
        }
    }
}

fn date_line(g: &mut Rng, plant: &mut Plant) -> String {
    let (y, m, d) = (1930 + g.below(90), 1 + g.below(12), 1 + g.below(28));
    let month = MONTHS[(m - 1) as usize];
    // The date, and the month-and-day inside it that must not survive either.
    let (date, day) = match g.below(11) {
        0 => (format!("{m:02}/{d:02}/{y}"), format!("{m:02}/{d:02}")),
        1 => (format!("{y}-{m:02}-{d:02}"), format!("{m:02}-{d:02}")),
        2 => (format!("{month} {d}, {y}"), format!("{month} {d}")),
        3 => (format!("{d} {month} {y}"), format!("{d} {month}")),
        4 => (format!("{m}-{d}-{:02}", y % 100), format!("{m}-{d}")),
        5 => (
            format!("{d:02}-{}-{y}", &month[..3]),
            format!("{d:02}-{}", &month[..3]),
        ),
        6 => (format!("{month} {d}th"), format!("{month} {d}")),
        7 => (format!("the {d}th of {month}"), format!("{d}th of {month}")),
        8 => {
            // Day first, which only a day above 12 tells apart.
            let d = 13 + g.below(16);
            (format!("{d}/{m}/{y}"), format!("{d}/{m}"))
        }
        9 => (format!("{y}/{m:02}/{d:02}"), format!("{m:02}/{d:02}")),
        _ => {
            let (label, date) = match g.below(3) {
                0 => ("Admitted on", format!("{m}/{d}")),
                1 => ("DOS:", format!("{m}/{d}")),
                _ => ("DOB:", format!("{y}{m:02}{d:02}")),
            };
            plant(Phi::Date, vec![date.clone()]);
            return format!("{label} {date} via the emergency department.");
        }
    };
    plant(Phi::Date, vec![date.clone(), day]);
    match g.below(3) {
        0 => format!("DOB: {date}"),
        1 => format!("Surgery was performed on {date} without complication."),
        _ => format!("Last colonoscopy {date}, normal."),
    }
}

fn age_line(g: &mut Rng, plant: &mut Plant) -> String {
    let age = (90 + g.below(20)).to_string();
    plant(Phi::Age, vec![age.clone()]);
    match g.below(6) {
        5 => format!("{age} y.o. female with falls."),
        0 => format!("{age}-year-old woman with dyspnea."),
        1 => format!("Age: {age}"),
        2 => format!("{age} y/o male, independent at home."),
        3 => format!("The patient, aged {age}, declines surgery."),
        _ => format!("{age} years old at admission."),
    }
}

fn phone(g: &mut Rng) -> String {
    let (a, b, c) = (g.digits(3), g.digits(3), g.digits(4));
    match g.below(7) {
        4 => format!("{a}{b}{c}"),
        5 => format!("{b}-{c}"),
        6 => format!("+44 20 {} {c}", g.digits(4)),
        0 => format!("({a}) {b}-{c}"),
        1 => format!("{a}-{b}-{c}"),
        2 => format!("{a}.{b}.{c}"),
        _ => format!("+1 {a} {b} {c}"),
    }
}

fn contact_line(g: &mut Rng, plant: &mut Plant) -> String {
    let (p, f) = (phone(g), phone(g));
    plant(Phi::Phone, vec![p.clone()]);
    plant(Phi::Fax, vec![f.clone()]);
    let user = format!("{}{}", invented_surname(g).to_lowercase(), g.digits(2));
    let email = format!("{user}@{}", g.pick(&["example.org", "mail.example.net"]));
    plant(Phi::Email, vec![email.clone(), user]);
    let call = if p.bytes().all(|b| b.is_ascii_digit()) {
        "Phone:"
    } else {
        "Call"
    };
    format!("{call} {p}, fax {f}; e-mail {email}.")
}

fn number_line(g: &mut Rng, plant: &mut Plant) -> String {
    let id = |g: &mut Rng, letters: usize, digits: usize| {
        let l: String = (0..letters)
            .map(|_| char::from(b'A' + g.below(26) as u8))
            .collect();
        format!("{l}{}", g.digits(digits))
    };
    let ssn = match g.below(3) {
        0 => format!("{}-{}-{}", g.digits(3), g.digits(2), g.digits(4)),
        1 => format!("{} {} {}", g.digits(3), g.digits(2), g.digits(4)),
        _ => g.digits(9),
    };
    let numbers = [
        (Phi::Ssn, g.pick(&["SSN:", "SS#", "Social Security:"]), ssn),
        (
            Phi::Mrn,
            g.pick(&[
                "MRN:",
                "MRN#",
                "MR#",
                "Med Rec #",
                "Medical Record Number:",
                "Chart #",
            ]),
            g.digits(8),
        ),
        (
            Phi::HealthPlan,
            g.pick(&[
                "Member ID:",
                "Medicaid #",
                "Policy number:",
                "Health plan beneficiary number",
                "Policy",
            ]),
            id(g, 3, 9),
        ),
        (
            Phi::Account,
            g.pick(&["Account #:", "Acct:", "Billing account #", "Acct"]),
            g.digits(10),
        ),
        (
            Phi::License,
            g.pick(&[
                "DEA #:",
                "Driver's license:",
                "NPI:",
                "License no.",
                "Driver's license",
                "NPI",
            ]),
            id(g, 2, 7),
        ),
        (
            Phi::Vehicle,
            g.pick(&[
                "VIN:",
                "License plate:",
                "VIN",
                "license plate is",
                "Plate number MA",
            ]),
            id(g, 3, 8),
        ),
        (
            Phi::Device,
            g.pick(&[
                "Pacemaker serial number:",
                "Device ID:",
                "Implant serial #",
                "device serial",
                "S/N",
            ]),
            id(g, 2, 8),
        ),
    ];
    numbers
        .into_iter()
        .map(|(phi, label, value)| {
            plant(phi, vec![value.clone()]);
            format!("{label} {value}")
        })
        .collect::<Vec<_>>()
        .join(". ")
}

fn network_line(g: &mut Rng, plant: &mut Plant) -> String {
    let ip = if g.below(4) == 0 {
        format!(
            "2001:db8:{:x}:{:x}::{:x}",
            g.below(65536),
            g.below(65536),
            g.below(65536)
        )
    } else {
        format!(
            "{}.{}.{}.{}",
            10 + g.below(200),
            g.below(256),
            g.below(256),
            1 + g.below(254)
        )
    };
    plant(Phi::Ip, vec![ip.clone()]);
    let visit = g.digits(7);
    let url = format!(
        "https://portal.example.org/{}?patient={visit}",
        g.pick(&["chart", "visit"])
    );
    plant(Phi::Url, vec![url.clone(), visit]);
    format!("Portal login from {ip}; results at {url}.")
}

/// Per category: identifiers planted, and those with a part that survived.
#[derive(Debug, Default)]
pub struct ProbeReport {
    pub planted: BTreeMap<Phi, u64>,
    pub leaked: BTreeMap<Phi, u64>,
    /// The first few leaks: (category, the part that survived, the redacted note).
    pub examples: Vec<(Phi, String, String)>,
}

impl ProbeReport {
    pub fn total_leaked(&self) -> u64 {
        self.leaked.values().sum()
    }

    pub fn table(&self) -> String {
        let mut out = format!("{:<14} {:>8} {:>7}\n", "category", "planted", "leaked");
        for (phi, n) in &self.planted {
            let leaked = self.leaked.get(phi).copied().unwrap_or(0);
            out += &format!("{:<14} {n:>8} {leaked:>7}\n", phi.placeholder());
        }
        out
    }
}

/// Redacts every probe note and counts the planted identifiers that survived.
pub fn run_probe(redactor: &Redactor, notes: &[ProbeNote]) -> ProbeReport {
    let mut report = ProbeReport::default();
    for note in notes {
        let (out, _) = redactor.redact(&note.text);
        for p in &note.planted {
            *report.planted.entry(p.phi).or_default() += 1;
            if let Some(part) = atoms(p).into_iter().find(|part| survives(&out, part)) {
                *report.leaked.entry(p.phi).or_default() += 1;
                if report.examples.len() < 20 {
                    report.examples.push((p.phi, part, out.clone()));
                }
            }
        }
    }
    report
}

/// What must not survive of a planted identifier: each part whole, and every group of 3+
/// digits in it (a phone number that comes out as "617 [PHONE]" leaked its area code). Dates
/// and ages are left whole: a year may stay, and their short numbers occur everywhere.
fn atoms(p: &Planted) -> Vec<String> {
    let mut out = p.parts.clone();
    if !matches!(p.phi, Phi::Date | Phi::Age) {
        for part in &p.parts {
            out.extend(
                part.split(|c: char| !c.is_ascii_digit())
                    .filter(|run| run.len() >= 3)
                    .map(str::to_string),
            );
        }
    }
    out
}

/// `part` still appears in `text` as a whole word (not inside a longer word or number).
pub fn survives(text: &str, part: &str) -> bool {
    crate::redact::names::is_whole_word_in(text, part)
}

/// Eponymous terms of medicine: each must survive redaction where it names a condition,
/// a test or a sign ("Parkinson disease", "Down syndrome", "Pap test").
pub const EPONYMS: &[&str] = &[
    "Parkinson",
    "Hodgkin",
    "Down",
    "Alzheimer",
    "Crohn",
    "Addison",
    "Cushing",
    "Graves",
    "Huntington",
    "Wilson",
    "Marfan",
    "Tourette",
    "Bell",
    "Lou Gehrig",
    "Guillain-Barr[ée]",
    "Hashimoto",
    "Kaposi",
    "Asperger",
    "Turner",
    "Klinefelter",
    "Raynaud",
    "Sj[öo]gren",
    "Charcot-Marie-Tooth",
    "Duchenne",
    "Becker",
    "Ehlers-Danlos",
    "Tay-Sachs",
    "Epstein-Barr",
    "Pap",
    "Williams",
    "Angelman",
    "Prader-Willi",
    "Fabry",
    "Gaucher",
    "Niemann-Pick",
    "Wilms",
    "Burkitt",
    "Paget",
    "Peyronie",
    "Meniere",
    "Kawasaki",
    "Reye",
    "Barrett",
    "Hirschsprung",
];

const EPONYM_USE: &str = r"(?:['’]s|['’])?[ \t-]+(?i:disease|syndrome|lymphoma|sarcoma|palsy|test|smear|virus|disorder|dystrophy|tumor|esophagus|thyroiditis|ataxia|anomaly|phenomenon|chorea|sign|neuralgia)\b";

/// What redaction took out of text that holds no PHI to protect (MedQuAD's public answers).
#[derive(Debug, Default)]
pub struct OverRedaction {
    pub documents: u64,
    pub bytes: u64,
    /// Time spent in the redactor alone (not in this report's bookkeeping).
    pub redact_secs: f64,
    pub replaced: BTreeMap<&'static str, u64>,
    /// Per eponym used as a term ("Parkinson disease"): occurrences in the input, and how many
    /// redaction removed.
    pub eponyms: BTreeMap<&'static str, (u64, u64)>,
    /// Per eponym, any occurrence (the namesake too: "Dr. Alois Alzheimer"): in, removed.
    pub eponym_words: BTreeMap<&'static str, (u64, u64)>,
    /// Up to three sentences per eponym word that lost it: (before, after).
    pub eponym_examples: BTreeMap<&'static str, Vec<(String, String)>>,
    /// Up to five redacted snippets per category, with the text around them.
    pub examples: BTreeMap<&'static str, Vec<String>>,
}

pub fn over_redaction<'a>(
    redactor: &Redactor,
    documents: impl IntoIterator<Item = &'a str>,
) -> OverRedaction {
    let patterns: Vec<(&'static str, Regex, Regex)> = EPONYMS
        .iter()
        .map(|e| {
            let word = Regex::new(&format!(r"\b{e}")).expect("eponym compiles");
            let term = Regex::new(&format!(r"\b{e}{EPONYM_USE}")).expect("eponym compiles");
            (*e, term, word)
        })
        .collect();
    let mut r = OverRedaction::default();
    for doc in documents {
        let start = std::time::Instant::now();
        let (out, rep) = redactor.redact(doc);
        r.redact_secs += start.elapsed().as_secs_f64();
        r.documents += 1;
        r.bytes += doc.len() as u64;
        for (k, v) in rep.replaced {
            *r.replaced.entry(k).or_default() += v;
        }
        for (e, term, word) in &patterns {
            let term_lost = count_kept(&mut r.eponyms, e, term, doc, &out);
            let word_lost = count_kept(&mut r.eponym_words, e, word, doc, &out);
            if term_lost || word_lost {
                let re = if term_lost { term } else { word };
                eponym_examples(redactor, doc, e, re, &mut r.eponym_examples);
            }
        }
        collect_examples(&out, &mut r.examples);
    }
    r
}

/// Adds the occurrences of `re` before and the ones lost after; true when some were lost.
fn count_kept(
    counts: &mut BTreeMap<&'static str, (u64, u64)>,
    key: &'static str,
    re: &Regex,
    before: &str,
    after: &str,
) -> bool {
    let (n, m) = (
        re.find_iter(before).count() as u64,
        re.find_iter(after).count() as u64,
    );
    let slot = counts.entry(key).or_default();
    slot.0 += n;
    slot.1 += n.saturating_sub(m);
    m < n
}

/// The sentences of `doc` whose redaction removes `eponym` (or, when only the whole document
/// shows it, the redacted text around it).
fn eponym_examples(
    redactor: &Redactor,
    doc: &str,
    eponym: &'static str,
    word: &Regex,
    examples: &mut BTreeMap<&'static str, Vec<(String, String)>>,
) {
    let list = examples.entry(eponym).or_default();
    for sentence in doc
        .split_inclusive(['.', '\n'])
        .filter(|s| word.is_match(s))
    {
        if list.len() >= 3 {
            return; // enough examples: no more redaction to find them
        }
        let (out, _) = redactor.redact(sentence);
        if word.find_iter(&out).count() < word.find_iter(sentence).count() {
            list.push((sentence.trim().to_string(), out.trim().to_string()));
        }
    }
}

fn collect_examples(out: &str, examples: &mut BTreeMap<&'static str, Vec<String>>) {
    for phi in Phi::ALL {
        let ph = phi.placeholder();
        let list = examples.entry(ph).or_default();
        for (i, _) in out
            .match_indices(ph)
            .take(5usize.saturating_sub(list.len()))
        {
            let start = out[..i].char_indices().rev().nth(40).map_or(0, |(j, _)| j);
            let end = out[i..]
                .char_indices()
                .nth(ph.len() + 40)
                .map_or(out.len(), |(j, _)| i + j);
            list.push(out[start..end].replace('\n', " "));
        }
    }
    examples.retain(|_, v| !v.is_empty());
}
