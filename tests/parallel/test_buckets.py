"""Shape buckets: at most 4 sizes an octave, never smaller than asked, under 20% padding past the first octave."""

from jaxwebrl.parallel.buckets import bucket


def test_bucket_sizes_hand_computed():
    assert [bucket(n) for n in range(1, 11)] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 10]
    assert [bucket(n) for n in (17, 20, 21, 33, 100)] == [20, 20, 24, 40, 112]
    assert bucket(250, 16) == 256 and bucket(257, 16) == 320 and bucket(1, 16) == 16


def test_bucket_bounds_padding_and_shape_count():
    sizes = [bucket(n, 16) for n in range(1, 16385)]
    assert all(b >= n and b % 16 == 0 for n, b in zip(range(1, 16385), sizes))
    assert all((b - n) / b < 0.2 for n, b in zip(range(129, 16385), sizes[128:]))
    assert len(set(sizes)) <= 8 + 4 * 11   # 8 sizes up to 128, then 4 an octave up to 16k
