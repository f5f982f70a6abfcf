//! A probe set of synthetic clinical notes with planted identifiers in many formats: after
//! redaction, none of them may survive (0 leaks), and each leaves its typed placeholder.

use lab_corpus::redact::{parse_anchor, Redactor};

/// A tiny deterministic generator (no external RNG: the probe set must never change).
struct Gen(u64);
impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.next() as usize % xs.len()]
    }
    fn digits(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b'0' + (self.next() % 10) as u8))
            .collect()
    }
}

const FIRST: &[&str] = &[
    "Alice", "Bogdan", "Chen", "Dolores", "Emeka", "Fatima", "Grace", "Hiroshi", "Ines", "Jamal",
];
const LAST: &[&str] = &[
    "Moreno",
    "Kowalski",
    "Okafor",
    "Nguyen",
    "O'Brien",
    "Smith-Jones",
    "Haddad",
    "Larsen",
    "Tanaka",
    "Rossi",
];
const MONTHS: &[&str] = &[
    "January", "Feb", "March", "Apr.", "May", "June", "Jul", "August", "Sept", "October", "Nov",
    "December",
];

struct Note {
    text: String,
    /// (identifier, the placeholder that must replace it)
    planted: Vec<(String, &'static str)>,
}

fn note(g: &mut Gen) -> Note {
    let mut planted = Vec::new();
    let mut plant = |s: String, ph: &'static str| {
        planted.push((s.clone(), ph));
        s
    };
    let name = format!("{} {}", g.pick(FIRST), g.pick(LAST));
    let honorific = g.pick(&["Dr.", "Dr", "Mr.", "Mrs.", "Ms.", "Prof.", "Nurse"]);
    let clinician = plant(name.clone(), "[NAME]");
    let patient = plant(format!("{} {}", g.pick(FIRST), g.pick(LAST)), "[NAME]");
    let mrn_label = g.pick(&[
        "MRN",
        "MRN:",
        "MRN#",
        "Medical Record Number:",
        "medical record no.",
        "Patient ID:",
        "Chart #",
    ]);
    let mrn_prefix = g.pick(&["", "A", "MR-", "HX"]);
    let mrn_len = 6 + (g.next() % 4) as usize;
    let mrn = plant(format!("{mrn_prefix}{}", g.digits(mrn_len)), "[MRN]");
    let ssn = plant(
        format!("{}-{}-{}", g.digits(3), g.digits(2), g.digits(4)),
        "[SSN]",
    );
    let (a, b, c) = (g.digits(3), g.digits(3), g.digits(4));
    let phone = plant(
        match g.next() % 5 {
            0 => format!("({a}) {b}-{c}"),
            1 => format!("{a}-{b}-{c}"),
            2 => format!("{a}.{b}.{c}"),
            3 => format!("+1 {a} {b} {c}"),
            _ => format!("1-{a}-{b}-{c}"),
        },
        "[PHONE]",
    );
    let fax = plant(
        format!("({}) {}-{}", g.digits(3), g.digits(3), g.digits(4)),
        "[FAX]",
    );
    let email = plant(
        format!(
            "{}.{}{}@{}",
            g.pick(FIRST).to_lowercase(),
            g.pick(LAST).to_lowercase().replace('\'', ""),
            g.digits(2),
            g.pick(&["example.org", "hospital.example.com", "mail.example.net"])
        ),
        "[EMAIL]",
    );
    let url = plant(
        format!(
            "https://portal.example.org/{}?patient={}",
            g.pick(&["chart", "visit", "records/view"]),
            g.digits(7)
        ),
        "[URL]",
    );
    let (y, m, d) = (1950 + g.next() % 70, 1 + g.next() % 12, 1 + g.next() % 28);
    let month = MONTHS[(m - 1) as usize];
    let date = plant(
        match g.next() % 5 {
            0 => format!("{m:02}/{d:02}/{y}"),
            1 => format!("{y}-{m:02}-{d:02}"),
            2 => format!("{month} {d}, {y}"),
            3 => format!("{d} {month} {y}"),
            _ => format!("{m}-{d}-{:02}", y % 100),
        },
        "[DATE]",
    );
    let dob = plant(
        format!(
            "{}/{}/{}",
            1 + g.next() % 12,
            1 + g.next() % 28,
            1930 + g.next() % 60
        ),
        "[DATE]",
    );
    let text = format!(
        "[HISTORY]\nPatient: {patient}, DOB {dob}, {mrn_label} {mrn}. SSN {ssn}.\n\
         Seen by {honorific} {clinician} on {date} for chest pain radiating to the left arm.\n\
         [ASSESSMENT]\nStable angina; ECG without acute changes. Contact {phone} or fax: {fax}.\n\
         [PLAN]\nStart aspirin 81 mg daily. Results: {url}. Questions to {email}.\n"
    );
    Note { text, planted }
}

#[test]
fn probe_notes_leak_no_planted_identifier() {
    let redactor = Redactor::new(None);
    let mut g = Gen(2024);
    let (mut checked, mut leaks) = (0, Vec::new());
    for _ in 0..500 {
        let n = note(&mut g);
        let (out, report) = redactor.redact(&n.text);
        for (id, placeholder) in &n.planted {
            checked += 1;
            // The identifier, and every run of 4+ of its digits, must be gone.
            let digit_runs: Vec<&str> = id
                .split(|c: char| !c.is_ascii_digit())
                .filter(|r| r.len() >= 4)
                .collect();
            let last_name = id.split(' ').nth(1).filter(|_| *placeholder == "[NAME]");
            if out.contains(id.as_str())
                || digit_runs.iter().any(|r| out.contains(r))
                || last_name.is_some_and(|l| out.contains(l))
            {
                leaks.push(format!("{id} ({placeholder}) in: {out}"));
            }
            assert!(out.contains(placeholder), "{placeholder} missing in {out}");
        }
        assert!(
            report.replaced.values().sum::<u64>() >= 10,
            "{report:?} {out}"
        );
        // The clinical content and the section headers survive.
        assert!(
            out.contains("[HISTORY]") && out.contains("Stable angina; ECG without acute changes."),
            "{out}"
        );
    }
    assert!(
        leaks.is_empty(),
        "{} of {checked} identifiers leaked:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
    assert_eq!(checked, 500 * 10);
}

#[test]
fn anchor_mode_keeps_only_text_up_to_the_first_later_date() {
    let redactor = Redactor::new(parse_anchor("2020-01-31"));
    let text = "Admitted 01/15/2020 (MRN 4432190). Discharged January 20, 2020. Readmitted 2020-03-02 with sepsis; died 3/9/2020.";
    let (out, report) = redactor.redact(text);
    assert_eq!(
        out,
        "Admitted [DATE] (MRN [MRN]). Discharged [DATE]. Readmitted "
    );
    assert_eq!(
        report.truncated_bytes as usize,
        text.len() - text.find("2020-03-02").unwrap()
    );
}
