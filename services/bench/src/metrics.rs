//! The services' `/metrics` pages, read with the test kit's parser
//! ([`MetricsPage`]), and the quantiles of their histograms.

use notify_testkit::metrics::MetricsPage;

/// `GET /metrics` of a service at `addr`; an empty page when it does not
/// answer within 5 s.
pub async fn scrape(addr: &str) -> MetricsPage {
    let text = async {
        let addr = tokio::net::lookup_host(addr).await.ok()?.next()?;
        let got = notify_testkit::try_http_get(addr, "/metrics");
        tokio::time::timeout(std::time::Duration::from_secs(5), got).await.ok()?.ok()
    };
    MetricsPage::parse(&text.await.map(|(_, body)| body).unwrap_or_default())
}

/// The `q` quantile of histogram `name` over its series whose labels
/// include every `(label, value)` (their buckets added up), estimated as
/// Prometheus's `histogram_quantile` does: linearly within the bucket that
/// holds it, and the highest finite bound when it falls in `+Inf`. `None`
/// without a sample.
pub fn histogram_quantile(
    page: &MetricsPage,
    name: &str,
    labels: &[(&str, &str)],
    q: f64,
) -> Option<f64> {
    let buckets = page.buckets(name, labels);
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(bound, count) in &buckets {
        if count >= rank {
            if bound.is_infinite() {
                return Some(lower);
            }
            let share = if count > below { (rank - below) / (count - below) } else { 1.0 };
            return Some(lower + (bound - lower) * share);
        }
        (lower, below) = (bound, count);
    }
    Some(lower)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "\
# TYPE notify_chunk_apply_seconds histogram
notify_chunk_apply_seconds_bucket{lane=\"bulk\",le=\"0.1\"} 10
notify_chunk_apply_seconds_bucket{lane=\"bulk\",le=\"0.2\"} 90
notify_chunk_apply_seconds_bucket{lane=\"bulk\",le=\"0.4\"} 100
notify_chunk_apply_seconds_bucket{lane=\"bulk\",le=\"+Inf\"} 100
notify_chunk_apply_seconds_bucket{lane=\"high\",le=\"0.1\"} 0
notify_chunk_apply_seconds_bucket{lane=\"high\",le=\"0.2\"} 0
notify_chunk_apply_seconds_bucket{lane=\"high\",le=\"0.4\"} 0
notify_chunk_apply_seconds_bucket{lane=\"high\",le=\"+Inf\"} 4
";

    #[test]
    fn histogram_quantiles_interpolate_within_their_bucket() {
        let page = MetricsPage::parse(PAGE);
        let name = "notify_chunk_apply_seconds";
        let bulk = |q| histogram_quantile(&page, name, &[("lane", "bulk")], q).unwrap();
        // 50 of 100 is the 40th of the 80 samples in (0.1, 0.2].
        assert!((bulk(0.5) - 0.15).abs() < 1e-9);
        assert!((bulk(0.05) - 0.05).abs() < 1e-9);
        assert!((bulk(0.95) - 0.3).abs() < 1e-9);
        // Past the last finite bound: that bound.
        assert_eq!(histogram_quantile(&page, name, &[("lane", "high")], 0.5), Some(0.4));
        // Series added up: 104 samples, the 52nd in (0.1, 0.2].
        let both = histogram_quantile(&page, name, &[], 0.5).unwrap();
        assert!((both - (0.1 + 0.1 * 42.0 / 80.0)).abs() < 1e-9);
        assert_eq!(histogram_quantile(&page, "notify_other_seconds", &[], 0.5), None);
    }
}
