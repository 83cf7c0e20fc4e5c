//! Slurm's compact host list syntax (`node[01-04,07],gpu3`), as in `SLURM_JOB_NODELIST`.
//!
//! A list is comma-separated items (commas inside brackets belong to the brackets); an item
//! is text with any number of bracket groups, each a comma-separated set of numbers and
//! `LO-HI` ranges. A range keeps the zero padding of its low bound (`01-10` gives `01` ...
//! `10`), and several groups multiply (`r[1-2]n[1-2]` gives `r1n1,r1n2,r2n1,r2n2`).

/// Why a host list did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostlistError(pub String);

impl std::fmt::Display for HostlistError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The host names of `list` in order, at most `limit` of them (more is an error, so a
/// hostile `n[0-4294967295]` costs nothing).
pub fn expand(list: &str, limit: usize) -> Result<Vec<String>, HostlistError> {
    let err = |m: String| Err(HostlistError(format!("host list {list:?}: {m}")));
    let mut hosts = Vec::new();
    for item in split_top(list).map_err(|m| HostlistError(format!("host list {list:?}: {m}")))? {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        // Each item is text and bracket groups alternating: build the product left to right.
        let mut partial = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            let (text, group) = match rest.find('[') {
                None => (rest, None),
                Some(open) => {
                    let Some(close) = rest[open..].find(']') else {
                        return err("an unclosed '['".into());
                    };
                    (&rest[..open], Some(&rest[open + 1..open + close]))
                }
            };
            if text.contains(']') {
                return err("a ']' without '['".into());
            }
            for p in &mut partial {
                p.push_str(text);
            }
            rest = &rest[text.len()..];
            if let Some(group) = group {
                let values = group_values(group, limit)
                    .map_err(|m| HostlistError(format!("host list {list:?}: [{group}]: {m}")))?;
                if partial.len().saturating_mul(values.len()) > limit {
                    return err(format!("more than {limit} hosts"));
                }
                partial = partial
                    .iter()
                    .flat_map(|p| values.iter().map(move |v| format!("{p}{v}")))
                    .collect();
                rest = &rest[group.len() + 2..];
            }
        }
        if hosts.len() + partial.len() > limit {
            return err(format!("more than {limit} hosts"));
        }
        hosts.extend(partial);
    }
    if hosts.is_empty() {
        return err("no host".into());
    }
    Ok(hosts)
}

/// The first host of `list` (where Slurm puts a step's task 0).
pub fn first(list: &str) -> Result<String, HostlistError> {
    // The first item alone, so a long list is not expanded for one name.
    let items = split_top(list).map_err(|m| HostlistError(format!("host list {list:?}: {m}")))?;
    let item = items
        .into_iter()
        .map(str::trim)
        .find(|i| !i.is_empty())
        .ok_or_else(|| HostlistError(format!("host list {list:?}: no host")))?;
    // Each group's first value: a product of one.
    let mut one = String::new();
    let mut rest = item;
    while let Some(open) = rest.find('[') {
        let close = rest[open..]
            .find(']')
            .ok_or_else(|| HostlistError(format!("host list {list:?}: an unclosed '['")))?;
        let group = &rest[open + 1..open + close];
        let v = group_first(group)
            .map_err(|m| HostlistError(format!("host list {list:?}: [{group}]: {m}")))?;
        one.push_str(&rest[..open]);
        one.push_str(&v);
        rest = &rest[open + close + 1..];
    }
    if rest.contains(']') {
        return Err(HostlistError(format!(
            "host list {list:?}: a ']' without '['"
        )));
    }
    one.push_str(rest);
    Ok(one)
}

/// Splits at the commas outside brackets.
fn split_top(list: &str) -> Result<Vec<&str>, String> {
    let (mut depth, mut start, mut out) = (0usize, 0, Vec::new());
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err("nested '['".into()),
            ']' if depth == 1 => depth = 0,
            ']' => return Err("a ']' without '['".into()),
            ',' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("an unclosed '['".into());
    }
    out.push(&list[start..]);
    Ok(out)
}

/// The ranges of one bracket group (`01-04,07`): low, high, and the low bound's width.
fn group_ranges(group: &str) -> Result<Vec<(u64, u64, usize)>, String> {
    group
        .split(',')
        .map(|part| {
            let part = part.trim();
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            if !digits(lo) || !digits(hi) {
                return Err(format!("{part:?} is not a number or LO-HI"));
            }
            let (a, b): (u64, u64) = match (lo.parse(), hi.parse()) {
                (Ok(a), Ok(b)) => (a, b),
                _ => return Err(format!("{part:?} is out of range")),
            };
            if a > b {
                return Err(format!("{part:?} runs backwards"));
            }
            Ok((a, b, lo.len()))
        })
        .collect()
}

/// The values of one bracket group, padded as written, at most `limit`.
fn group_values(group: &str, limit: usize) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for (a, b, width) in group_ranges(group)? {
        if (b - a) as usize >= limit.saturating_sub(out.len()) {
            return Err(format!("more than {limit} hosts"));
        }
        out.extend((a..=b).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

/// The first value of one bracket group (all of it checked, none of it expanded).
fn group_first(group: &str) -> Result<String, String> {
    let (a, _, width) = group_ranges(group)?[0];
    Ok(format!("{a:0width$}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(s: &str) -> Vec<String> {
        expand(s, 1000).unwrap()
    }

    #[test]
    fn slurm_forms() {
        assert_eq!(x("node1"), ["node1"]);
        assert_eq!(x("a,b"), ["a", "b"]);
        assert_eq!(
            x("node[01-04,07]"),
            ["node01", "node02", "node03", "node04", "node07"]
        );
        assert_eq!(x("n[8-10]"), ["n8", "n9", "n10"]);
        assert_eq!(x("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(
            x("gpu3,cn[1-2]-ib,login"),
            ["gpu3", "cn1-ib", "cn2-ib", "login"]
        );
        assert_eq!(x("r[1-2]n[1,3]"), ["r1n1", "r1n3", "r2n1", "r2n3"]);
        assert_eq!(
            x("h[1-2].cluster.org"),
            ["h1.cluster.org", "h2.cluster.org"]
        );
        assert_eq!(x("10.0.0.[1-2]"), ["10.0.0.1", "10.0.0.2"]);
    }

    #[test]
    fn first_host_without_expanding() {
        assert_eq!(first("node[01-04,07]").unwrap(), "node01");
        assert_eq!(first("gpu3,cn[1-2]").unwrap(), "gpu3");
        assert_eq!(first("r[2-3]n[5-9]x").unwrap(), "r2n5x");
        assert_eq!(first("n[0-4294967295]").unwrap(), "n0");
        for s in ["node[01-04,07]", "a,b[3-4]", "r[1-2]n[1,3]", "x"] {
            assert_eq!(first(s).unwrap(), x(s)[0], "{s}");
        }
    }

    #[test]
    fn malformed_lists_are_errors() {
        for bad in [
            "", ",", "n[1-2", "n]1", "n[[1]]", "n[a-b]", "n[4-2]", "n[]", "n[1-]", "n[-1]",
        ] {
            assert!(expand(bad, 1000).is_err(), "{bad:?} expanded");
        }
        assert!(first("").is_err() && first("n[1-2").is_err() && first("n[x]").is_err());
        let e = expand("n[0-4294967295]", 1000).unwrap_err();
        assert!(e.0.contains("more than 1000"), "{e}");
        assert!(expand("a[1-40]b[1-40]", 1000).is_err());
        assert!(expand("n[99999999999999999999]", 10).is_err());
    }
}
