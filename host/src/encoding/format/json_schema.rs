//! JSON Schema: the plugin's JSON validated against the subject's schema (the jsonschema crate:
//! drafts 4 to 2020-12, the draft named by `$schema`) and published as it is, framed. External
//! `$ref`s are not fetched: a registry schema with references is refused when it is parsed.

use serde_json::Value as Json;

/// A compiled JSON Schema.
#[derive(Debug)]
pub struct JsonSchema {
    validator: jsonschema::Validator,
}

impl JsonSchema {
    /// Compiles schema text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let schema: Json =
            serde_json::from_str(text).map_err(|e| format!("not a JSON Schema: {e}"))?;
        let validator =
            jsonschema::validator_for(&schema).map_err(|e| format!("not a JSON Schema: {e}"))?;
        Ok(Self { validator })
    }

    /// `Ok` when `json` is valid; else the first violation, at its JSON path.
    pub fn validate(&self, json: &Json) -> Result<(), String> {
        self.validator.validate(json).map_err(|e| {
            let at = e.instance_path().to_string();
            let at = if at.is_empty() {
                "$".to_owned()
            } else {
                format!("$ at {at}")
            };
            format!("{at}: {}", e.masked())
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn violations_name_the_path_but_not_the_value() {
        let schema = JsonSchema::parse(
            r#"{"type": "object", "required": ["id"],
                "properties": {"id": {"type": "integer"}, "email": {"type": "string", "maxLength": 3}}}"#,
        )
        .unwrap();
        assert!(schema.validate(&json!({"id": 1})).is_ok());
        let missing = schema.validate(&json!({"email": "a"})).unwrap_err();
        assert!(
            missing.contains("\"id\" is a required property"),
            "{missing}"
        );
        let long = schema
            .validate(&json!({"id": 1, "email": "secret@example.com"}))
            .unwrap_err();
        assert!(long.starts_with("$ at /email: "), "{long}");
        assert!(!long.contains("secret@"), "{long}");
    }
}
