//! What `/proc/self/maps` says of an address.

/// True when `addr` lies in a private (copy-on-write) mapping of this process, as
/// `/proc/self/maps` says: braid's regions are shared mappings of their files until pages
/// are exchanged into them (page exchange maps the sender's pages privately).
pub fn mapped_private(addr: *const u8) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    let a = addr as usize;
    maps.lines().any(|l| {
        let mut f = l.split_whitespace();
        let (range, perms) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
        let Some((lo, hi)) = range.split_once('-') else {
            return false;
        };
        let lo = usize::from_str_radix(lo, 16).unwrap_or(usize::MAX);
        let hi = usize::from_str_radix(hi, 16).unwrap_or(0);
        lo <= a && a < hi && perms.ends_with('p')
    })
}
