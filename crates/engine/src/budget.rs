//! Memory budgets as people write them, and the memory the process actually uses.

/// `48G`, `512M`, `1.5GiB`, `4096` (bytes; K, M, G, T are powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = s[i..].to_ascii_uppercase();
            let mul = match unit.trim_end_matches(['B', 'I']) {
                "" => 1u64,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => return Err(format!("`{s}`: unknown size unit (use K, M, G or T)")),
            };
            (&s[..i], mul)
        }
        None => (s, 1),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("`{s}` is not a size like 48G"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("`{s}` is not a size like 48G"));
    }
    let bytes = v * mul as f64;
    if bytes >= u64::MAX as f64 {
        return Err(format!("`{s}` is larger than any memory"));
    }
    Ok(bytes as u64)
}

/// The process's peak resident set, measured by the kernel (VmHWM), where available.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The machine's physical memory (MemTotal).
pub fn total_memory_bytes() -> Option<u64> {
    meminfo("MemTotal:")
}

/// Memory the kernel says can be given to a new process without swapping (MemAvailable).
pub(crate) fn available_memory_bytes() -> Option<u64> {
    meminfo("MemAvailable:")
}

fn meminfo(key: &str) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = info.lines().find(|l| l.starts_with(key))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("48G").unwrap(), 48 << 30);
        assert_eq!(parse_size("512m").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("12X").is_err());
        assert!(parse_size("lots").is_err());
        for bad in ["-1G", "nan", "inf", "1e30T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn available_memory_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(super::available_memory_bytes().is_some_and(|b| b > 0));
        }
    }
}
