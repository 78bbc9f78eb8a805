//! The stable hash and bucket functions. Never change their output.

/// Number of virtual buckets. Fixed forever: shard maps are written against it.
pub const BUCKETS: u32 = 1024;

/// Mixes a 64-bit id with the MurmurHash3 `fmix64` finalizer.
///
/// `fmix64` is a bijection with full avalanche, so sequential ids (the common
/// case for user ids) spread evenly over buckets. The constants are those of
/// MurmurHash3 and must never change.
pub const fn stable_hash(id: u64) -> u64 {
    let mut h = id;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// Hashes a string key (such as a sender and idempotency key) with 64-bit
/// FNV-1a followed by [`stable_hash`]. Fixed forever, like [`stable_hash`].
pub fn stable_hash_str(key: &str) -> u64 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let fnv = key.bytes().fold(FNV_OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME));
    stable_hash(fnv)
}

/// Returns the virtual bucket of an id (a user id or a message id).
pub const fn bucket_of(id: u64) -> u32 {
    (stable_hash(id) % BUCKETS as u64) as u32
}

/// Returns the virtual bucket of a string key.
pub fn bucket_of_key(key: &str) -> u32 {
    (stable_hash_str(key) % u64::from(BUCKETS)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known vectors: these values are part of the storage format. If this test
    /// fails, the hash changed and every deployed shard map would be wrong.
    #[test]
    fn stable_hash_matches_known_vectors() {
        let vectors: [(u64, u64, u32); 6] = [
            (0, 0, 0),
            (1, 0xb456_bcfc_34c2_cb2c, 812),
            (2, 0x3abf_2a20_6506_83e7, 999),
            (42, 0x8108_7960_8e42_59cc, 460),
            (1_000_000, 0x443b_192c_ac3f_a823, 35),
            (u64::MAX, 0x64b5_720b_4b82_5f21, 801),
        ];
        for (id, hash, bucket) in vectors {
            assert_eq!(stable_hash(id), hash, "stable_hash({id})");
            assert_eq!(bucket_of(id), bucket, "bucket_of({id})");
        }
    }

    #[test]
    fn string_hash_matches_known_vectors() {
        assert_eq!(stable_hash_str(""), stable_hash(0xcbf2_9ce4_8422_2325));
        assert_eq!(bucket_of_key("billing/order-1"), bucket_of_key("billing/order-1"));
        assert_eq!(stable_hash_str("billing\u{1f}order-1"), 0x1bb6_5bd9_82cd_30da);
    }
}
