//! Content negotiation: which text format a scrape gets, from its `Accept` header, q-values
//! honoured (RFC 9110 §12.5.1). Prometheus sends OpenMetrics with a higher q than the classic
//! format; `curl` sends `*/*`; either may say `q=0`, which means "not this one".

/// Which text format the client asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    Classic,
}

/// How much the client wants one format: the q of the most specific media range that matches
/// it (`type/subtype` over `type/*` over `*/*`), and whether it was named exactly.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Preference {
    /// 0 exact, 1 `type/*`, 2 `*/*`; `None`: no range matched.
    specificity: Option<u8>,
    q: f32,
}

impl Preference {
    fn consider(&mut self, specificity: u8, q: f32) {
        if self.specificity.is_none_or(|s| specificity < s) {
            *self = Self { specificity: Some(specificity), q };
        }
    }

    fn named(&self) -> bool {
        self.specificity == Some(0)
    }
}

/// The format for an `Accept` header (`None`: no header). OpenMetrics wins when its q is higher,
/// or equal and it was named exactly (`application/openmetrics-text, text/plain`); otherwise the
/// classic format, which is also what a client gets that accepts neither (as other exporters
/// answer, rather than 406: a human with a browser still sees the metrics).
pub fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else { return Format::Classic };
    let mut openmetrics = Preference::default();
    let mut classic = Preference::default();
    for range in accept.split(',') {
        let Some((media, q)) = media_range(range) else { continue };
        let (kind, subtype) = media;
        let matches = |want_kind: &str, want_subtype: &str| -> Option<u8> {
            match (kind.as_str(), subtype.as_str()) {
                ("*", "*") => Some(2),
                (k, "*") if k == want_kind => Some(1),
                (k, s) if k == want_kind && s == want_subtype => Some(0),
                _ => None,
            }
        };
        if let Some(specificity) = matches("application", "openmetrics-text") {
            openmetrics.consider(specificity, q);
        }
        if let Some(specificity) = matches("text", "plain") {
            classic.consider(specificity, q);
        }
    }
    let wins = openmetrics.q > classic.q || (openmetrics.q == classic.q && openmetrics.named());
    if openmetrics.q > 0.0 && wins { Format::OpenMetrics } else { Format::Classic }
}

/// One `type/subtype; param=value; q=0.5` range, lower-cased, with its q (1 when absent); `None`
/// for something that is not a media range, or a q that is not a number from 0 to 1.
fn media_range(range: &str) -> Option<((String, String), f32)> {
    let mut parts = range.split(';');
    let (kind, subtype) = parts.next()?.trim().split_once('/')?;
    let (kind, subtype) = (kind.trim().to_ascii_lowercase(), subtype.trim().to_ascii_lowercase());
    if kind.is_empty() || subtype.is_empty() {
        return None;
    }
    let mut q = 1.0;
    for parameter in parts {
        if let Some((name, value)) = parameter.split_once('=')
            && name.trim().eq_ignore_ascii_case("q")
        {
            q = value.trim().parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q))?;
        }
    }
    Some(((kind, subtype), q))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(accept: &str) -> Format {
        negotiate(Some(accept))
    }

    #[test]
    fn no_header_or_anything_goes_gets_the_classic_format() {
        assert_eq!(negotiate(None), Format::Classic);
        assert_eq!(format("*/*"), Format::Classic);
        assert_eq!(format("text/plain"), Format::Classic);
        assert_eq!(format(""), Format::Classic);
    }

    #[test]
    fn what_prometheus_sends_gets_openmetrics() {
        let prometheus = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,\
                          application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;q=0.4,\
                          text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert_eq!(format(prometheus), Format::OpenMetrics);
        assert_eq!(format("application/openmetrics-text; version=1.0.0"), Format::OpenMetrics);
        assert_eq!(format("Application/OpenMetrics-Text, text/plain"), Format::OpenMetrics, "named exactly, same q");
    }

    #[test]
    fn a_higher_q_for_the_classic_format_wins_over_openmetrics_named_first() {
        assert_eq!(format("application/openmetrics-text;q=0.1, text/plain;q=0.9"), Format::Classic);
        assert_eq!(format("application/openmetrics-text;q=0.5, text/*;q=0.6"), Format::Classic);
        assert_eq!(format("text/plain;q=0.2, application/openmetrics-text ; Q=0.3"), Format::OpenMetrics);
    }

    #[test]
    fn q_zero_means_not_acceptable() {
        assert_eq!(format("application/openmetrics-text;q=0"), Format::Classic);
        assert_eq!(format("application/openmetrics-text;q=0, */*;q=0.1"), Format::Classic);
        assert_eq!(format("text/plain;q=0, application/openmetrics-text;q=0.01"), Format::OpenMetrics);
        assert_eq!(format("text/plain;q=0.0, application/*"), Format::OpenMetrics);
    }

    #[test]
    fn the_most_specific_range_decides_a_formats_q() {
        // */* would give OpenMetrics q 1, but its own range says 0.
        assert_eq!(format("*/*, application/openmetrics-text;q=0"), Format::Classic);
        assert_eq!(format("application/*;q=0, application/openmetrics-text"), Format::OpenMetrics);
    }

    #[test]
    fn malformed_ranges_are_skipped() {
        assert_eq!(format("garbage, application/openmetrics-text;q=2"), Format::Classic, "q above 1");
        assert_eq!(format("application/openmetrics-text;q=high"), Format::Classic);
        assert_eq!(format("/openmetrics-text, application/openmetrics-text;q=0.5"), Format::OpenMetrics);
    }
}
