//! The one verdict vocabulary: levels, threshold bands (from docs/thresholds.md, overridable on
//! the command line), judged metrics, advice, and the `Verdict` every summary carries in the same
//! shape (`level`, `headline`, `metrics`, `advice`).

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

    /// The level a JSON line names (`compare` reads runs back).
    pub fn parse(name: &str) -> Option<Level> {
        [Level::Unknown, Level::Ok, Level::Warn, Level::Crit].into_iter().find(|l| l.name() == name)
    }
}

impl Serialize for Level {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Level {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Level::parse(&text).ok_or_else(|| serde::de::Error::custom(format!("unknown level: {text:?}")))
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

    /// A band of durations in nanoseconds, refused in the units the user typed.
    pub fn durations(
        name: &str,
        warn: std::time::Duration,
        crit: std::time::Duration,
    ) -> Result<Self, crate::error::UserError> {
        if warn > crit {
            return Err(crate::error::UserError::new(format!(
                "--{name}-warn ({}) must be no longer than --{name}-crit ({})",
                crate::units::format_nanos(warn.as_nanos() as u64),
                crate::units::format_nanos(crit.as_nanos() as u64)
            )));
        }
        Ok(Self { warn: warn.as_nanos() as f64, crit: crit.as_nanos() as f64 })
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

/// Declares an enum whose variants each have one spelling, used by the text and the JSON alike
/// (`name()`, `Display`, `Serialize`): a capability's metrics and causes.
macro_rules! named {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        $vis enum $name { $($(#[$vmeta])* $variant),+ }

        impl $name {
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// The variant spelled `name` (how `compare` reads runs back).
            pub fn parse(name: &str) -> Option<Self> {
                [$($name::$variant),+].into_iter().find(|v| v.name() == name)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.name())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.name())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                Self::parse(&text).ok_or_else(|| serde::de::Error::custom(format!("unknown {}: {text:?}", stringify!($name))))
            }
        }
    };
}
pub(crate) use named;

named! {
    /// What a metric's value, `warn` and `crit` are counted in (metric names carry no unit).
    pub enum Unit {
        /// 0 to 1.
        Fraction => "fraction",
        Ns => "ns",
        PerSecond => "per_second",
        /// A quotient of two like quantities.
        Ratio => "ratio",
        /// How many (triage's findings of one source, as compare reads them).
        Count => "count",
    }
}

impl Unit {
    /// The value as the text prints it.
    pub fn format(self, value: f64) -> String {
        match self {
            Unit::Fraction => format!("{:.2} %", value * 100.0),
            Unit::Ns => crate::units::format_nanos(value.max(0.0) as u64),
            Unit::PerSecond => format!("{value:.0}/s"),
            Unit::Ratio => format!("{value:.1}x"),
            Unit::Count => format!("{value:.0}"),
        }
    }
}

/// Why a metric with no value is UNKNOWN when nothing more precise is known.
pub const NOTHING_SEEN: &str = "nothing to judge was seen";

/// One judged quantity: what it measures, its value against its band, and its level. Every
/// command prints it; `compare` reads it back (`MetricVerdict<String>`).
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct MetricVerdict<M> {
    pub metric: M,
    /// What it measures, in words.
    pub definition: std::borrow::Cow<'static, str>,
    pub unit: Unit,
    pub value: Option<f64>,
    pub level: Level,
    pub warn: f64,
    pub crit: f64,
    /// Why `value` is null and the level UNKNOWN, when it is.
    pub unknown_because: Option<String>,
}

impl<M> MetricVerdict<M> {
    /// `value` classified by `band`; a value computed from incomplete data (`unknown_because`)
    /// is no value.
    pub fn judged(
        metric: M,
        definition: &'static str,
        unit: Unit,
        value: Option<f64>,
        band: Band,
        unknown_because: Option<String>,
    ) -> Self {
        let value = if unknown_because.is_some() { None } else { value };
        Self {
            metric,
            definition: definition.into(),
            unit,
            value,
            level: band.classify(value),
            warn: band.warn,
            crit: band.crit,
            unknown_because: unknown_because.or_else(|| value.is_none().then(|| NOTHING_SEEN.into())),
        }
    }
}

/// One piece of advice: what it blames, the numbers that justify it, and what to do.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Advice<C> {
    pub cause: C,
    pub evidence: String,
    pub action: String,
}

/// Every command's verdict, one shape: the level, one line that says why (the level not repeated
/// in it), the judged metrics and the advice tied to them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict<M, C> {
    pub level: Level,
    pub headline: String,
    pub metrics: Vec<MetricVerdict<M>>,
    pub advice: Vec<Advice<C>>,
}

impl<M, C> Default for Verdict<M, C> {
    fn default() -> Self {
        Self { level: Level::Unknown, headline: NOTHING_SEEN.into(), metrics: Vec::new(), advice: Vec::new() }
    }
}

impl<M: Copy + PartialEq + std::fmt::Display, C> Verdict<M, C> {
    /// The worst metric's level (UNKNOWN only when no metric could be judged), said in a
    /// headline that names the metric that decides it.
    pub fn of(metrics: Vec<MetricVerdict<M>>, advice: Vec<Advice<C>>) -> Self {
        let level = metrics.iter().map(|m| m.level).max().unwrap_or(Level::Unknown);
        let headline = headline(&metrics);
        Self { level, headline, metrics, advice }
    }
}

impl<M, C> Verdict<M, C> {
    /// The metric the headline names: the first of the worst judged (none when nothing was).
    pub fn deciding(&self) -> Option<&MetricVerdict<M>> {
        deciding(&self.metrics)
    }
}

/// The first of the worst judged: metrics come in the order of their importance.
fn deciding<M>(metrics: &[MetricVerdict<M>]) -> Option<&MetricVerdict<M>> {
    metrics.iter().rev().filter(|m| m.value.is_some()).max_by_key(|m| m.level)
}

/// `metric`'s level among `metrics` (UNKNOWN when it is not judged there).
pub fn level_of<M: PartialEq>(metrics: &[MetricVerdict<M>], metric: M) -> Level {
    metrics.iter().find(|m| m.metric == metric).map_or(Level::Unknown, |m| m.level)
}

/// "retry_rate 85.00 % (CRIT above 15.00 %)", or why nothing could be judged.
fn headline<M: std::fmt::Display>(metrics: &[MetricVerdict<M>]) -> String {
    let Some(worst) = deciding(metrics) else {
        let why = metrics.iter().find_map(|m| m.unknown_because.as_deref()).unwrap_or(NOTHING_SEEN);
        return why.to_string();
    };
    let value = worst.unit.format(worst.value.unwrap_or_default());
    let band = if worst.level == Level::Crit {
        format!("CRIT above {}", worst.unit.format(worst.crit))
    } else {
        format!("WARN from {}", worst.unit.format(worst.warn))
    };
    format!("{} {value} ({band})", worst.metric)
}

impl<M: std::fmt::Display, C: std::fmt::Display> Verdict<M, C> {
    /// The verdict as every command's text ends: the level and headline, one row per metric
    /// (value, level, band; why it is unknown), then the advice.
    pub fn text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(out, "\nVerdict: {}: {}", self.level.name(), self.headline);
        for m in &self.metrics {
            let value = m.value.map_or_else(|| "-".to_string(), |v| m.unit.format(v));
            let band = format!("(warn {}, crit {})", m.unit.format(m.warn), m.unit.format(m.crit));
            let _ = writeln!(out, "  {:<22} {:>10}  {:<7} {band}", m.metric, value, m.level.name());
            if let (None, Some(why)) = (m.value, &m.unknown_because) {
                let _ = writeln!(out, "    {why}");
            }
        }
        if !self.advice.is_empty() {
            let _ = writeln!(out, "\nAdvice");
            for a in &self.advice {
                let _ = writeln!(out, "  - {}: {}\n    -> {}", a.cause, a.evidence, a.action);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    named! {
        enum Metric {
            Rate => "rate",
            Latency => "latency",
        }
    }

    fn band() -> Band {
        Band { warn: 0.05, crit: 0.15 }
    }

    #[test]
    fn the_worst_metric_decides_and_the_headline_names_the_first_of_the_worst() {
        let metrics = vec![
            MetricVerdict::judged(Metric::Rate, "", Unit::Fraction, Some(0.5), band(), None),
            MetricVerdict::judged(Metric::Latency, "", Unit::Ns, Some(900_000.0), Band { warn: 1e5, crit: 5e5 }, None),
        ];
        let verdict: Verdict<Metric, &str> = Verdict::of(metrics, Vec::new());
        assert_eq!(verdict.level, Level::Crit);
        assert_eq!(verdict.headline, "rate 50.00 % (CRIT above 15.00 %)");
        assert_eq!(level_of(&verdict.metrics, Metric::Latency), Level::Crit);
        assert_eq!(verdict.deciding().map(|m| m.metric), Some(Metric::Rate));
    }

    #[test]
    fn a_value_from_incomplete_data_is_none_and_nothing_judged_is_unknown_never_ok() {
        let lost = MetricVerdict::judged(Metric::Rate, "", Unit::Fraction, Some(0.0), band(), Some("lost".into()));
        assert_eq!((lost.value, lost.level), (None, Level::Unknown));
        let unseen = MetricVerdict::judged(Metric::Latency, "", Unit::Ns, None, band(), None);
        assert_eq!(unseen.unknown_because.as_deref(), Some(NOTHING_SEEN));
        let verdict: Verdict<Metric, &str> = Verdict::of(vec![lost, unseen], Vec::new());
        assert_eq!((verdict.level, verdict.headline.as_str()), (Level::Unknown, "lost"));
        // One metric judged is enough for a level: the others stay UNKNOWN beside it.
        let ok = MetricVerdict::judged(Metric::Rate, "", Unit::Fraction, Some(0.01), band(), None);
        let unseen = MetricVerdict::judged(Metric::Latency, "", Unit::Ns, None, band(), None);
        assert_eq!(Verdict::<Metric, &str>::of(vec![ok, unseen], Vec::new()).level, Level::Ok);
    }

    #[test]
    fn the_text_prints_the_level_each_metric_and_the_advice() {
        let metrics = vec![MetricVerdict::judged(Metric::Rate, "", Unit::Fraction, None, band(), Some("lost".into()))];
        let advice = vec![Advice { cause: "cause", evidence: "evidence".into(), action: "action".into() }];
        let text = Verdict::of(metrics, advice).text();
        assert!(text.starts_with("\nVerdict: UNKNOWN: lost\n  rate "), "{text}");
        assert!(text.contains("    lost\n"), "{text}");
        assert!(text.ends_with("\nAdvice\n  - cause: evidence\n    -> action\n"), "{text}");
    }
}
