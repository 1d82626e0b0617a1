//! The log2 histogram's bucketing, which the kernel programs compute and user space reads back.

/// Bucket index of `value` in a log2 histogram of `buckets` slots (slot k holds [2^k, 2^(k+1)),
/// slot 0 also holds 0). BPF has no count-leading-zeros instruction, so it halves the search six
/// times, in arithmetic rather than branches: with a branch per step the verifier carried each
/// of the 64 possible bucket values as a state of its own, and a program with three histograms
/// (the callback timing's return) walked 93,000 instructions on 6.1 for 330 of code.
#[inline(always)]
pub fn log2_bucket(value: u64, buckets: u32) -> u32 {
    let mut rest = value;
    let bucket = shift_if_upper_half(&mut rest, 32)
        + shift_if_upper_half(&mut rest, 16)
        + shift_if_upper_half(&mut rest, 8)
        + shift_if_upper_half(&mut rest, 4)
        + shift_if_upper_half(&mut rest, 2)
        + shift_if_upper_half(&mut rest, 1);
    let bucket = bucket as u32;
    if bucket >= buckets { buckets - 1 } else { bucket }
}

/// One step of [`log2_bucket`] on a value below 2^(2·half): when its upper `half` bits are not
/// all zero, shifts them down and returns `half`, else returns 0. Adding half's all-ones to the
/// upper part carries into bit `half` exactly when that part is non-zero: no comparison.
#[inline(always)]
fn shift_if_upper_half(value: &mut u64, half: u32) -> u64 {
    let upper = *value >> half;
    let nonzero = (upper + ((1u64 << half) - 1)) >> half;
    let shift = nonzero * half as u64;
    *value >>= shift;
    shift
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bucket by counting bits, which BPF cannot do in one instruction.
    fn by_leading_zeros(value: u64, buckets: u32) -> u32 {
        let bucket = if value == 0 { 0 } else { 63 - value.leading_zeros() };
        bucket.min(buckets - 1)
    }

    #[test]
    fn every_power_of_two_and_its_neighbours_land_where_counting_bits_puts_them() {
        let mut values = vec![0, 1, 2, 3, u64::MAX, u64::MAX - 1];
        for k in 0..64 {
            let power = 1u64 << k;
            values.extend([power, power - 1, power + 1, power | (power >> 1), power.wrapping_mul(3)]);
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(x >> (x % 64));
        }
        for value in values {
            for buckets in [1, 8, 32, 48, 64] {
                assert_eq!(log2_bucket(value, buckets), by_leading_zeros(value, buckets), "{value} in {buckets}");
            }
        }
    }
}
