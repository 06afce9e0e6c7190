//! The configuration every property test uses, so that a failure can be rerun:
//!
//! - the seed is `PROPTEST_RNG_SEED` when set, a fresh random one otherwise, and is
//!   printed (libtest shows it with a failure): `PROPTEST_RNG_SEED=<seed> cargo test ...`
//!   generates the same cases again;
//! - regression files committed under a crate's `proptest-regressions/` are replayed
//!   first, as proptest does by default;
//! - nothing is written: a new failure prints the line to add to that file instead of
//!   leaving an untracked file that makes later runs on that machine differ from a clean
//!   clone's.
//!
//! ```ignore
//! proptest::proptest! {
//!     #![proptest_config(keelson_testkit::proptest::config())]
//!     #[test]
//!     fn roundtrip(x in 0u32..) { /* ... */ }
//! }
//! ```

use std::any::Any;
use std::fmt;

use proptest::test_runner::{
    Config, FailurePersistence, FileFailurePersistence, PersistedSeed, RngSeed,
};

/// Where committed regression files live (proptest's default).
const REGRESSIONS: &str = "proptest-regressions";

/// The seed of this run: `PROPTEST_RNG_SEED`, or a random one.
fn seed() -> u64 {
    match std::env::var("PROPTEST_RNG_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("PROPTEST_RNG_SEED={s:?}: expected a u64")),
        Err(_) => {
            use std::hash::{BuildHasher, Hasher};
            // std's per-process random keys: no extra dependency for 64 random bits.
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or_default(),
            );
            h.finish()
        }
    }
}

/// The default configuration (256 cases, or `PROPTEST_CASES`) with the seed printed.
pub fn config() -> Config {
    with_cases(Config::default().cases)
}

/// [`config`] with `cases` cases (unless `PROPTEST_CASES` says otherwise).
pub fn with_cases(cases: u32) -> Config {
    let seed = seed();
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("this test");
    eprintln!("proptest: seed {seed}; rerun {test} with PROPTEST_RNG_SEED={seed}");
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: Some(Box::new(ReadOnly)),
        ..Config::default()
    }
}

/// Replays the committed regression files; never writes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReadOnly;

impl FailurePersistence for ReadOnly {
    fn load_persisted_failures2(&self, source_file: Option<&'static str>) -> Vec<PersistedSeed> {
        FileFailurePersistence::SourceParallel(REGRESSIONS).load_persisted_failures2(source_file)
    }

    fn save_persisted_failure2(
        &mut self,
        source_file: Option<&'static str>,
        seed: PersistedSeed,
        shrunken_value: &dyn fmt::Debug,
    ) {
        eprintln!(
            "proptest: to replay this case on every run, commit this line in {REGRESSIONS}/ \
             beside the crate's src/ (the file named after {}, .txt):\ncc {seed} # shrinks to {shrunken_value:?}",
            source_file.unwrap_or("the test's source file")
        );
    }

    fn box_clone(&self) -> Box<dyn FailurePersistence> {
        Box::new(*self)
    }

    fn eq(&self, other: &dyn FailurePersistence) -> bool {
        other.as_any().downcast_ref::<Self>().is_some()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;

    /// The same seed draws the same cases: what "rerun with the seed" relies on.
    #[test]
    fn a_fixed_seed_draws_the_same_values() {
        let draw = |seed: u64| {
            let mut runner = TestRunner::new(Config {
                rng_seed: RngSeed::Fixed(seed),
                ..Config::default()
            });
            (0..20)
                .map(|_| "[a-z]{1,12}".new_tree(&mut runner).unwrap().current())
                .collect::<Vec<String>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn the_config_fixes_a_seed_and_writes_nothing() {
        let c = config();
        assert!(matches!(c.rng_seed, RngSeed::Fixed(_)));
        let mut p = c.failure_persistence.unwrap();
        let before = std::fs::read_dir(env!("CARGO_MANIFEST_DIR"))
            .unwrap()
            .count();
        p.save_persisted_failure2(
            Some(file!()),
            p.load_persisted_failures2(Some(file!()))
                .into_iter()
                .next()
                .unwrap_or_else(|| "xs 1 2 3 4".parse().unwrap()),
            &"value",
        );
        let after = std::fs::read_dir(env!("CARGO_MANIFEST_DIR"))
            .unwrap()
            .count();
        assert_eq!(before, after, "a regression file was written");
    }
}
