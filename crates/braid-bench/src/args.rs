//! Argument types shared by several `braid` subcommands, so one flag parses one way
//! everywhere.

use anyhow::{Result, bail};

use braid_testbed::parse::{Rate, parse_rate_or_none};

/// A rail's shaped rate (`--rate 1gbit`, tc units), or none (`--rate none`: no tbf, plain
/// veth, as fast as the CPUs move packets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RailRate(pub Option<Rate>);

/// Parses `--rate`: tc units, or `none`.
pub fn rail_rate(s: &str) -> Result<RailRate> {
    parse_rate_or_none(s).map(RailRate)
}

impl RailRate {
    /// The rate, for a subcommand that needs shaped rails (`none` is an error naming
    /// `what` to use instead).
    pub fn shaped(&self, instead: &str) -> Result<Rate> {
        match self.0 {
            Some(r) => Ok(r),
            None => bail!("--rate none is not supported here: {instead}"),
        }
    }
}
