//! Counted nouns for the text: "1 VMA", "3 VMAs", never "1 VMAs" or "VMA(s)".

/// `n` and the noun in the number it needs.
pub fn counted(n: u64, singular: &str, plural: &str) -> String {
    format!("{n} {}", if n == 1 { singular } else { plural })
}

/// The common case: the plural adds an `s`.
pub fn count_of(n: u64, noun: &str) -> String {
    counted(n, noun, &format!("{noun}s"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_is_singular_every_other_count_plural() {
        assert_eq!(count_of(1, "VMA"), "1 VMA");
        assert_eq!(count_of(0, "VMA"), "0 VMAs");
        assert_eq!(count_of(26, "VMA"), "26 VMAs");
        assert_eq!(counted(1, "full pass", "full passes"), "1 full pass");
        assert_eq!(counted(2, "full pass", "full passes"), "2 full passes");
    }
}
