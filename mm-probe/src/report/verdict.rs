//! The verdict levels and threshold bands every command judges with (bands come from
//! docs/thresholds.md and can be overridden on the command line).

use serde::{Serialize, Serializer};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Not observable here, or nothing to judge (no walks, no invalidations): never "OK".
    #[default]
    Unknown,
    Ok,
    Warn,
    Crit,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Unknown => "UNKNOWN",
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Crit => "CRIT",
        }
    }
}

impl Serialize for Level {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// OK below `warn`, CRIT above `crit`, WARN in between (both bounds inclusive in WARN).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Band {
    pub warn: f64,
    pub crit: f64,
}

impl Band {
    /// A band from `--NAME-warn` and `--NAME-crit`, refused unless 0 <= warn <= crit.
    pub fn checked(name: &str, warn: f64, crit: f64) -> Result<Self, crate::error::UserError> {
        if !(warn.is_finite() && crit.is_finite() && warn >= 0.0 && warn <= crit) {
            return Err(crate::error::UserError::new(format!(
                "--{name}-warn ({warn}) must be a number no larger than --{name}-crit ({crit})"
            )));
        }
        Ok(Self { warn, crit })
    }

    pub fn classify(&self, value: Option<f64>) -> Level {
        match value {
            None => Level::Unknown,
            Some(v) if v.is_nan() => Level::Unknown,
            Some(v) if v < self.warn => Level::Ok,
            Some(v) if v > self.crit => Level::Crit,
            Some(_) => Level::Warn,
        }
    }
}
