//! Tallies: structs of named u64 counts that a window adds into the run's total.

/// Declares a `Copy` struct of `u64` counts (JSON as written, one key a field) that adds into
/// another of its kind with `+=`, so a new count cannot be forgotten where windows merge.
macro_rules! tally {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: u64,)+
        }

        impl std::ops::AddAssign for $name {
            fn add_assign(&mut self, other: Self) {
                $(self.$field += other.$field;)+
            }
        }
    };
}
pub(crate) use tally;

#[cfg(test)]
mod tests {
    tally! {
        /// Two counts.
        pub struct Pair {
            pub a,
            /// The second.
            pub b,
        }
    }

    #[test]
    fn every_count_adds_and_serializes_by_its_name() {
        let mut total = Pair { a: 1, b: 2 };
        total += Pair { a: 10, b: 20 };
        assert_eq!(total, Pair { a: 11, b: 22 });
        assert_eq!(serde_json::to_string(&total).unwrap(), r#"{"a":11,"b":22}"#);
    }
}
