//! Newline-delimited JSON: every line carries `type` and `schema_version`, then its payload.

use serde::Serialize;
use serde_json::{Map, Value};

/// Version of the NDJSON schema family; bump it when a field changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 1;

/// One NDJSON line of kind `kind` (`interval`, `summary`, `spike`, `probe_plan`, `lost_events`…).
pub fn line(kind: &str, payload: &impl Serialize) -> String {
    let mut object = Map::new();
    object.insert("type".into(), Value::from(kind));
    object.insert("schema_version".into(), Value::from(SCHEMA_VERSION));
    match serde_json::to_value(payload) {
        Ok(Value::Object(fields)) => object.extend(fields),
        Ok(other) => {
            object.insert("value".into(), other);
        }
        Err(e) => {
            object.insert("error".into(), Value::from(e.to_string()));
        }
    }
    Value::Object(object).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_has_type_and_version() {
        #[derive(Serialize)]
        struct Interval {
            retries: u64,
        }
        let text = line("interval", &Interval { retries: 3 });
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["type"], "interval");
        assert_eq!(v["schema_version"], SCHEMA_VERSION);
        assert_eq!(v["retries"], 3);
    }
}
