//! CRC-32 (IEEE 802.3, reflected: the one of zlib, gzip and Python's `zlib.crc32`), the checksum
//! of a tile's data section ([`super::format`]) and of a plan's row points ([`super::plan`]).

const fn crc_tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut j = 0;
        while j < 8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            j += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        let mut s = 1;
        while s < 8 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            s += 1;
        }
        i += 1;
    }
    t
}

static CRC_TABLES: [[u32; 256]; 8] = crc_tables();

/// A running CRC-32 (slice-by-8): `Crc32::new().update(b).finish() == zlib.crc32(b)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Crc32(u32);

impl Default for Crc32 {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32 {
    /// A fresh checksum.
    pub(crate) fn new() -> Self {
        Crc32(!0)
    }
    /// Feeds bytes.
    pub(crate) fn update(&mut self, bytes: &[u8]) -> &mut Self {
        let t = &CRC_TABLES;
        let mut c = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for ch in &mut chunks {
            let lo = c ^ u32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]);
            c = t[7][(lo & 0xff) as usize]
                ^ t[6][((lo >> 8) & 0xff) as usize]
                ^ t[5][((lo >> 16) & 0xff) as usize]
                ^ t[4][(lo >> 24) as usize]
                ^ t[3][ch[4] as usize]
                ^ t[2][ch[5] as usize]
                ^ t[1][ch[6] as usize]
                ^ t[0][ch[7] as usize];
        }
        for &b in chunks.remainder() {
            c = t[0][((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
        }
        self.0 = c;
        self
    }
    /// The checksum of everything fed so far.
    pub(crate) fn finish(&self) -> u32 {
        !self.0
    }
}

/// CRC-32 of `bytes`.
pub fn crc32(bytes: &[u8]) -> u32 {
    Crc32::new().update(bytes).finish()
}

/// CRC-32 of f64 values as little-endian bytes (the checksum of a safetensors f64 array).
pub(crate) fn crc32_f64(values: &[f64]) -> u32 {
    let mut c = Crc32::new();
    for_le_chunks(values, |b| {
        c.update(b);
        Ok(())
    })
    .expect("no error from the checksum");
    c.finish()
}

/// Calls `f` on the little-endian bytes of `values`, a bounded chunk at a time.
pub(super) fn for_le_chunks(values: &[f64], mut f: impl FnMut(&[u8]) -> std::io::Result<()>) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(8 * 8192);
    for ch in values.chunks(8192) {
        buf.clear();
        ch.iter().for_each(|v| buf.extend_from_slice(&v.to_le_bytes()));
        f(&buf)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_zlib() {
        // zlib.crc32(b"123456789") == 0xcbf43926; b"" -> 0
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
        let long: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut c = Crc32::new();
        c.update(&long[..13]).update(&long[13..]);
        assert_eq!(c.finish(), crc32(&long));
        // bytewise reference
        let mut r = !0u32;
        for &b in &long {
            r ^= b as u32;
            for _ in 0..8 {
                r = if r & 1 != 0 { 0xEDB8_8320 ^ (r >> 1) } else { r >> 1 };
            }
        }
        assert_eq!(!r, crc32(&long));
    }
}
