from sdaccel.bench.stats import percentile, summarize


def test_percentile_interpolates_between_ranks():
    assert percentile([4.0, 1.0, 3.0, 2.0], 90) == 1.0 + 0.9 * 3  # ranks 0..3, position 2.7 -> 3.7
    assert percentile([5.0], 90) == 5.0
    assert percentile([1.0, 2.0], 0) == 1.0 and percentile([1.0, 2.0], 100) == 2.0


def test_summary_is_ordered():
    s = summarize([0.3, 0.1, 0.2, 0.9])
    assert s["min"] == 0.1 and s["max"] == 0.9 and s["median"] == 0.25
    assert s["min"] <= s["median"] <= s["p90"] <= s["max"] and abs(s["mean"] - 0.375) < 1e-12
