//! The one loss ledger: what a capability's kernel side could not record, by kind. Every kind a
//! capability declares is asked for its count when the ledger is built (`LostEvents::from_fn`),
//! printed in the `lost_events` line under its name and in the text in its words, so a loss
//! cannot be declared and left unreported.

use std::collections::BTreeMap;

use serde::{Serialize, Serializer, ser::SerializeMap as _};

/// One capability's kinds of loss.
pub trait LossKind: Copy + Ord + 'static {
    const ALL: &'static [Self];
    /// Its key in the `lost_events` line.
    fn name(self) -> &'static str;
    /// What was lost and why, in the text's words ("wakeup spikes (ring buffer full)").
    fn what(self) -> &'static str;
}

/// Declares a capability's loss kinds: `Variant => "json_name", "what the text says"`.
macro_rules! loss_kinds {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$vmeta:meta])* $variant:ident => $key:literal, $what:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
        $vis enum $name { $($(#[$vmeta])* $variant),+ }

        impl $crate::report::lost::LossKind for $name {
            const ALL: &'static [$name] = &[$($name::$variant),+];

            fn name(self) -> &'static str {
                match self { $($name::$variant => $key),+ }
            }

            fn what(self) -> &'static str {
                match self { $($name::$variant => $what),+ }
            }
        }
    };
}
pub(crate) use loss_kinds;

/// Every kind's count; `None` where this kernel does not count that kind (null in the JSON,
/// "uncounted" in the text, never 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostEvents<K: LossKind> {
    counts: BTreeMap<K, Option<u64>>,
}

impl<K: LossKind> Default for LostEvents<K> {
    fn default() -> Self {
        Self::from_fn(|_| Some(0))
    }
}

impl<K: LossKind> LostEvents<K> {
    /// The ledger, every kind asked for its count.
    pub fn from_fn(mut count: impl FnMut(K) -> Option<u64>) -> Self {
        Self { counts: K::ALL.iter().map(|&kind| (kind, count(kind))).collect() }
    }

    /// The same ledger with one kind's count set.
    pub fn with(mut self, kind: K, count: Option<u64>) -> Self {
        self.counts.insert(kind, count);
        self
    }

    /// `kind`'s count, 0 where it is uncounted.
    pub fn get(&self, kind: K) -> u64 {
        self.count(kind).unwrap_or(0)
    }

    pub fn count(&self, kind: K) -> Option<u64> {
        self.counts.get(&kind).copied().flatten()
    }

    pub fn total(&self) -> u64 {
        self.counts.values().flatten().sum()
    }

    /// "lost events: none", or each kind lost (and each uncounted) in words, on one line.
    pub fn text(&self) -> String {
        let parts: Vec<String> = self
            .counts
            .iter()
            .filter_map(|(kind, count)| match count {
                Some(0) => None,
                Some(n) => Some(format!("{n} {}", kind.what())),
                None => Some(format!("{} (uncounted on this kernel)", kind.what())),
            })
            .collect();
        if parts.is_empty() { "lost events: none\n".into() } else { format!("lost events: {}\n", parts.join(", ")) }
    }
}

impl<K: LossKind> Serialize for LostEvents<K> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.counts.len()))?;
        for (kind, count) in &self.counts {
            map.serialize_entry(kind.name(), count)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    loss_kinds! {
        enum Kind {
            Spikes => "spikes", "spikes (ring buffer full)",
            Skipped => "skipped", "program runs skipped",
        }
    }

    #[test]
    fn every_kind_is_in_the_json_and_an_uncounted_one_is_null_and_said() {
        let lost = LostEvents::from_fn(|k| match k {
            Kind::Spikes => Some(3),
            Kind::Skipped => None,
        });
        assert_eq!(serde_json::to_string(&lost).unwrap(), r#"{"spikes":3,"skipped":null}"#);
        assert_eq!(
            lost.text(),
            "lost events: 3 spikes (ring buffer full), program runs skipped (uncounted on this kernel)\n"
        );
        assert_eq!(LostEvents::<Kind>::default().text(), "lost events: none\n");
        assert_eq!(LostEvents::<Kind>::default().total(), 0);
    }
}
