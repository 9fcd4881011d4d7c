//! Parsing replay files: a JSON error names the field it is in (`config.head_size: invalid
//! type: string "x", expected usize`), not only its line and column.

use serde::de::DeserializeOwned;

/// `text` as a `T`, or (line, column, message) with the path of the field at fault leading
/// the message. Files parse at full speed; only a failed parse is repeated, tracking the path.
pub fn parse<T: DeserializeOwned>(text: &str) -> Result<T, (usize, usize, String)> {
    let first = match serde_json::from_str(text) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let tracked: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    match tracked {
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let message = if path.is_empty() || path == "." {
                inner.to_string()
            } else {
                format!("{path}: {inner}")
            };
            Err((inner.line(), inner.column(), message))
        }
        // The value parsed and what follows it did not (trailing characters).
        Ok(_) => Err((first.line(), first.column(), first.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use crate::Case;

    #[test]
    fn errors_name_the_field_path() {
        let err = |text: &str| Case::from_json(text).unwrap_err().to_string();
        let e = err(r#"{"config": {"num_heads": 1, "num_kv_heads": 1, "head_size": "x"}}"#);
        assert!(
            e.contains("config.head_size: invalid type: string \"x\""),
            "{e}"
        );
        assert!(
            e.starts_with("malformed case JSON at line 1, column"),
            "{e}"
        );
        let e = err(r#"{"config": {"num_heads": 1, "bogus": 2}}"#);
        assert!(
            e.contains("config.bogus: unknown field `bogus`")
                || e.contains("config: unknown field `bogus`"),
            "{e}"
        );
        let e = err(r#"{"batch": {"seq_lens": [1, -2]}}"#);
        assert!(
            e.contains("batch.seq_lens[1]: invalid value: integer `-2`"),
            "{e}"
        );
        let e = err("[1, 2");
        assert!(e.contains("malformed case JSON at line 1"), "{e}");
        let case = crate::build_case(
            &[2],
            &[1],
            crate::AttentionConfig::new(1, 1, 2, 2, crate::DType::F32),
            1,
            &crate::BuildOptions::default(),
        );
        let e = err(&format!("{} x", serde_json::to_string(&case).unwrap()));
        assert!(e.contains("trailing characters"), "{e}");
        let e = crate::Trace::from_json(
            r#"{"num_blocks": 2, "sequences": [], "steps": [{"seqs": [{"seq": "a"}]}]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("steps[0].seqs[0].seq: invalid type"), "{e}");
        assert!(e.starts_with("malformed trace JSON"), "{e}");
    }
}
