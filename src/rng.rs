//! The benchmarks' random numbers: splitmix64 seeded with 42 (BENCHMARKS.md), task `i` using the
//! i-th output.

/// splitmix64 (Steele, Lea, Flood 2014), exactly as BENCHMARKS.md gives it.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// The generator with the given seed (the benchmarks use 42).
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next output.
    #[inline]
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform float in [0, 1) from the next output (53 random bits).
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_reference_outputs() {
        // Reference values of splitmix64 with seed 0 (from the original C code by Vigna).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next(), 0x6E78_9E6A_A1B9_65F4);
        let f = SplitMix64::new(42).next_f64();
        assert!((0.0..1.0).contains(&f));
    }
}
