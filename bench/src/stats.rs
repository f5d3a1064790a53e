//! Percentiles of samples (nearest rank on a sorted copy).

/// p50, p95, p99 and max of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Summary {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

/// The summary of `samples`, or `None` if there are none.
pub(crate) fn summarize(samples: &[f64]) -> Option<Summary> {
    let sorted = sorted(samples.to_vec());
    Some(Summary {
        p50: percentile(&sorted, 50.0)?,
        p95: percentile(&sorted, 95.0)?,
        p99: percentile(&sorted, 99.0)?,
        max: *sorted.last()?,
    })
}

/// `values` in ascending order.
pub(crate) fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

/// (lowest, median, highest) of `values`; NaN for none.
pub(crate) fn spread(values: &[f64]) -> (f64, f64, f64) {
    let sorted = sorted(values.to_vec());
    (
        sorted.first().copied().unwrap_or(f64::NAN),
        sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN),
        sorted.last().copied().unwrap_or(f64::NAN),
    )
}

/// The nearest-rank `p`-th percentile of ascending `sorted`: the smallest sample with at least
/// p % of the samples at or below it.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let samples: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = summarize(&samples);
        assert_eq!(
            s,
            Some(Summary {
                p50: 50.0,
                p95: 95.0,
                p99: 99.0,
                max: 100.0
            })
        );
        assert_eq!(summarize(&[7.0]).map(|s| s.p50), Some(7.0));
        assert_eq!(summarize(&[]), None);
    }
}
