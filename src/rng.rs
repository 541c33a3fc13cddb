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

    /// The benchmarks' seed (BENCHMARKS.md: splitmix64 seeded with 42, task `i` using the i-th
    /// output), against the definition computed independently (Python, 64-bit wrapping), and
    /// `next_f64` as the output's top 53 bits over 2^53, exactly.
    #[test]
    fn seed_42_gives_the_benchmarks_outputs_and_floats_from_their_top_53_bits() {
        let mut r = SplitMix64::new(42);
        assert_eq!(r.next(), 0xBDD7_3226_2FEB_6E95);
        assert_eq!(r.next(), 0x28EF_E333_B266_F103);
        assert_eq!(r.next(), 0x4752_6757_130F_9F52);
        // 0xBDD732262FEB6E95 >> 11 = 6679422623415661; over 2^53 (a power of two: exact).
        assert_eq!(
            SplitMix64::new(42).next_f64(),
            6_679_422_623_415_661.0 / 9_007_199_254_740_992.0
        );
        // 0xE220A8397B1DCDAF >> 11 = 7956156453446585.
        assert_eq!(
            SplitMix64::new(0).next_f64(),
            7_956_156_453_446_585.0 / 9_007_199_254_740_992.0
        );
    }
}
