//! Bad input gets a clear error naming the file and the fix, or a counted skip; never a
//! panic, never a silently empty output, never a half-written data dir.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lab_corpus::prepare::{prepare, PrepareConfig, Split};
use parquet::basic::{Compression, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

fn config(inputs: Vec<PathBuf>, out: &Path) -> PrepareConfig {
    let mut cfg = PrepareConfig::new(inputs, out.to_path_buf());
    cfg.split = Split::ValFraction(0.3);
    cfg
}

fn error_of(cfg: PrepareConfig) -> String {
    let out = cfg.output_dir.clone();
    let e = format!("{:#}", prepare(cfg).err().expect("prepare should fail"));
    assert!(!e.contains('\n'), "one-line error: {e}");
    assert!(
        !out.join("meta.json").exists(),
        "no meta.json after a failure"
    );
    if out.exists() {
        let left: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "left {left:?} behind after: {e}");
    }
    e
}

fn notes(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("Note {i}: the patient reports mild headaches after long shifts; hydration and rest advised, review in {i} weeks."))
        .collect()
}

fn write_jsonl(path: &Path, texts: &[String]) {
    let lines: Vec<String> = texts
        .iter()
        .map(|t| serde_json::json!({"text": t, "kind": "note"}).to_string())
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

fn write_parquet(path: &Path, columns: &[(&str, Vec<String>)], compression: Compression) {
    let fields: Vec<String> = columns
        .iter()
        .map(|(name, _)| format!("REQUIRED BYTE_ARRAY {name} (UTF8);"))
        .collect();
    let schema = Arc::new(
        parse_message_type(&format!("message schema {{ {} }}", fields.join(" "))).unwrap(),
    );
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(compression)
            .build(),
    );
    let mut writer = SerializedFileWriter::new(File::create(path).unwrap(), schema, props).unwrap();
    // Two row groups, to read across a boundary.
    let rows = columns[0].1.len();
    for range in [0..rows / 2, rows / 2..rows] {
        let mut rg = writer.next_row_group().unwrap();
        let mut i = 0;
        while let Some(mut col) = rg.next_column().unwrap() {
            let values: Vec<ByteArray> = columns[i].1[range.clone()]
                .iter()
                .map(|s| ByteArray::from(s.as_str()))
                .collect();
            col.typed::<ByteArrayType>()
                .write_batch(&values, None, None)
                .unwrap();
            col.close().unwrap();
            i += 1;
        }
        rg.close().unwrap();
    }
    writer.close().unwrap();
}

#[test]
fn corrupt_zstd_is_a_clear_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(lab_corpus::MEDQUAD_ZST).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid..mid + 64].iter_mut().for_each(|b| *b ^= 0x5a);
    let bad = dir.path().join("medquad.jsonl.zst");
    std::fs::write(&bad, &bytes).unwrap();
    let e = error_of(config(vec![bad.clone()], &dir.path().join("out")));
    assert!(
        e.contains(&bad.display().to_string()) && e.contains("corrupt"),
        "{e}"
    );

    let truncated = dir.path().join("cut.jsonl.zst");
    std::fs::write(
        &truncated,
        &std::fs::read(lab_corpus::MEDQUAD_ZST).unwrap()[..100_000],
    )
    .unwrap();
    let e = error_of(config(vec![truncated], &dir.path().join("out2")));
    assert!(
        e.contains("cut.jsonl.zst") && e.contains("truncated"),
        "{e}"
    );
}

#[test]
fn parquet_reads_snappy_and_zstd_pages_and_names_a_missing_column() {
    let dir = tempfile::tempdir().unwrap();
    let texts = notes(40);
    let kinds: Vec<String> = (0..40)
        .map(|i| if i % 2 == 0 { "a" } else { "b" }.to_string())
        .collect();
    let snappy = dir.path().join("snappy.parquet");
    let zstd = dir.path().join("zstd.parquet");
    write_parquet(
        &snappy,
        &[("text", texts.clone()), ("kind", kinds.clone())],
        Compression::SNAPPY,
    );
    write_parquet(
        &zstd,
        &[("text", texts.clone()), ("kind", kinds)],
        Compression::ZSTD(ZstdLevel::default()),
    );
    let mut cfg = config(vec![snappy.clone(), zstd], &dir.path().join("ok"));
    cfg.read.type_field = Some("kind".into());
    let meta = prepare(cfg).unwrap().meta;
    let input = &meta.filters[0]["input_by_type"];
    assert_eq!(
        (input["a"]["docs"].as_u64(), input["b"]["docs"].as_u64()),
        (Some(40), Some(40))
    );

    let no_text = dir.path().join("body.parquet");
    write_parquet(&no_text, &[("body", texts)], Compression::SNAPPY);
    let e = error_of(config(vec![no_text], &dir.path().join("out")));
    assert!(
        e.contains("body.parquet")
            && e.contains("no column `text`")
            && e.contains("body")
            && e.contains("--text-field"),
        "{e}"
    );
}

#[test]
fn invalid_utf8_is_a_counted_skip_and_an_all_invalid_input_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("mixed.jsonl");
    write_jsonl(&jsonl, &notes(30));
    let mut bytes = std::fs::read(&jsonl).unwrap();
    bytes.extend_from_slice(b"{\"text\": \"bad \xff\xfe bytes\"}\n{\"text\": \"more \xc3\x28\"}\n");
    std::fs::write(&jsonl, &bytes).unwrap();
    let meta = prepare(config(vec![jsonl], &dir.path().join("ok")))
        .unwrap()
        .meta;
    let skip = meta
        .filters
        .iter()
        .find(|f| f["name"] == "skip-invalid-utf8")
        .unwrap();
    assert_eq!(skip["removed_docs"], 2);
    assert_eq!(meta.filters[0]["input_by_type"]["all"]["docs"], 30);

    let txt = dir.path().join("latin1.txt");
    std::fs::write(&txt, b"caf\xe9 au lait").unwrap();
    let e = error_of(config(vec![txt], &dir.path().join("out")));
    assert!(
        e.contains("no training tokens") && e.contains("skip-invalid-utf8 1"),
        "{e}"
    );
}

#[test]
fn an_empty_directory_and_a_missing_path_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(empty.join("notes.csv"), "not a corpus format").unwrap();
    let e = error_of(config(vec![empty], &dir.path().join("out")));
    assert!(e.contains("empty") && e.contains("holds no"), "{e}");
    let e = error_of(config(
        vec![dir.path().join("nope")],
        &dir.path().join("out"),
    ));
    assert!(
        e.contains("nope") && e.to_lowercase().contains("no such file"),
        "{e}"
    );
}

#[test]
fn a_100mb_single_line_is_skipped_and_counted_without_loading_it() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("huge.jsonl");
    write_jsonl(&jsonl, &notes(30));
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&jsonl)
            .unwrap();
        f.write_all(b"{\"text\": \"").unwrap();
        let block = vec![b'a'; 1 << 20];
        for _ in 0..100 {
            f.write_all(&block).unwrap();
        }
        f.write_all(b"\"}\n").unwrap();
    }
    let meta = prepare(config(vec![jsonl], &dir.path().join("ok")))
        .unwrap()
        .meta;
    let skip = meta
        .filters
        .iter()
        .find(|f| f["name"] == "skip-oversize")
        .unwrap();
    assert_eq!(skip["removed_docs"], 1);

    // The same line as the only document of a text file: an error, not an empty output.
    let txt = dir.path().join("one-line.txt");
    std::fs::write(&txt, vec![b'x'; 100 << 20]).unwrap();
    let e = error_of(config(vec![txt], &dir.path().join("out")));
    assert!(
        e.contains("skip-oversize 1") && e.contains("--max-doc-bytes"),
        "{e}"
    );
}

#[test]
fn a_wrong_text_field_is_an_error_not_an_empty_output() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("docs.jsonl");
    write_jsonl(&jsonl, &notes(10));
    let mut cfg = config(vec![jsonl], &dir.path().join("out"));
    cfg.read.text_field = "body".into();
    let e = error_of(cfg);
    assert!(
        e.contains("skip-missing-text-field 10") && e.contains("--text-field"),
        "{e}"
    );
}
