//! Reads a `/metrics` page (the Prometheus text format) with the
//! `prometheus-parse` crate, for tests and the bench: the sum of a counter's
//! or gauge's series, and a histogram's buckets.
//!
//! The parser splits label sets at every `,` and `=`: fine for Notify's
//! labels (method paths, codes, lanes, outcomes), not for label values that
//! contain either.

use prometheus_parse::{Sample, Scrape, Value};

/// A parsed `/metrics` page.
pub struct MetricsPage {
    text: String,
    scrape: Scrape,
}

impl MetricsPage {
    /// Parses `text`; lines that are no sample, type or help are skipped.
    pub fn parse(text: &str) -> Self {
        let lines = text.lines().map(|line| Ok(line.to_owned()));
        let scrape = Scrape::parse(lines).expect("lines of a string read");
        Self { text: text.to_owned(), scrape }
    }

    /// The page as scraped.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The samples of `name` whose labels include every `(label, value)`.
    fn series<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> {
        self.scrape.samples.iter().filter(move |sample| {
            sample.metric == name
                && labels.iter().all(|(label, value)| sample.labels.get(label) == Some(*value))
        })
    }

    /// Sum of the series of counter, gauge or untyped metric `name` (a
    /// histogram's `_sum` and `_count` included) whose labels include every
    /// `(label, value)`; 0 when there is none.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.series(name, labels)
            .filter_map(|sample| match sample.value {
                Value::Counter(value) | Value::Gauge(value) | Value::Untyped(value) => Some(value),
                Value::Histogram(_) | Value::Summary(_) => None,
            })
            // Not `sum()`: an empty f64 sum is -0.0, which prints as "-0".
            .fold(0.0, |total, value| total + value)
    }

    /// The buckets of histogram `name`, `(upper bound, cumulative count)`
    /// by rising bound, over its series whose labels include every
    /// `(label, value)`, added up; empty when there is none.
    pub fn buckets(&self, name: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
        let mut buckets: Vec<(f64, f64)> = Vec::new();
        for sample in self.series(name, labels) {
            let Value::Histogram(counts) = &sample.value else { continue };
            for count in counts {
                match buckets.iter_mut().find(|(bound, _)| *bound == count.less_than) {
                    Some((_, total)) => *total += count.count,
                    None => buckets.push((count.less_than, count.count)),
                }
            }
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        buckets
    }
}

impl std::fmt::Debug for MetricsPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Sums every series of counter or gauge `name` on a page (0 when absent).
pub fn metric_sum(page: &str, name: &str) -> f64 {
    MetricsPage::parse(page).sum(name, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "\
# TYPE notify_chunks_total counter
notify_chunks_total{lane=\"bulk\",outcome=\"delivered\"} 7
notify_chunks_total{lane=\"high\",outcome=\"delivered\"} 2
notify_chunks_total{lane=\"bulk\",outcome=\"skipped\"} 1
# TYPE notify_up gauge
notify_up 1
# TYPE notify_apply_seconds histogram
notify_apply_seconds_bucket{lane=\"bulk\",le=\"0.1\"} 1
notify_apply_seconds_bucket{lane=\"bulk\",le=\"+Inf\"} 3
notify_apply_seconds_bucket{lane=\"high\",le=\"0.1\"} 2
notify_apply_seconds_bucket{lane=\"high\",le=\"+Inf\"} 2
notify_apply_seconds_sum{lane=\"bulk\"} 0.5
notify_apply_seconds_count{lane=\"bulk\"} 3
";

    #[test]
    fn series_are_summed_by_name_and_labels() {
        let page = MetricsPage::parse(PAGE);
        assert_eq!(page.sum("notify_chunks_total", &[]), 10.0);
        assert_eq!(page.sum("notify_chunks_total", &[("outcome", "delivered")]), 9.0);
        let bulk = [("lane", "bulk"), ("outcome", "delivered")];
        assert_eq!(page.sum("notify_chunks_total", &bulk), 7.0);
        assert_eq!(page.sum("notify_up", &[]), 1.0);
        assert_eq!(page.sum("notify_apply_seconds_count", &[("lane", "bulk")]), 3.0);
        let absent = page.sum("notify_other_total", &[]);
        assert_eq!(absent.to_string(), "0", "an absent metric reads 0, not -0");
        assert_eq!(metric_sum(PAGE, "notify_chunks_total"), 10.0);
    }

    #[test]
    fn histogram_buckets_are_added_up_by_bound() {
        let page = MetricsPage::parse(PAGE);
        let bulk = page.buckets("notify_apply_seconds", &[("lane", "bulk")]);
        assert_eq!(bulk, [(0.1, 1.0), (f64::INFINITY, 3.0)]);
        let both = page.buckets("notify_apply_seconds", &[]);
        assert_eq!(both, [(0.1, 3.0), (f64::INFINITY, 5.0)]);
        assert!(page.buckets("notify_other_seconds", &[]).is_empty());
    }
}
