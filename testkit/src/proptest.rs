//! The configuration every property test uses, so that a run can be repeated:
//!
//! - the seed is `PROPTEST_RNG_SEED` when set; otherwise, **with `CI` set** (`make test`),
//!   a fixed seed per test (derived from its name): a submission is judged on the same
//!   cases every time, and a rare input cannot fail one run and pass the next. Without
//!   `CI`, or with `KEELSON_PROPTEST_EXPLORE` set (`make proptest-explore`), a fresh random
//!   seed each run: that is where new cases are found. The seed is printed (libtest shows
//!   it with a failure): `PROPTEST_RNG_SEED=<seed> cargo test ...` draws the same cases;
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

/// The seed of this run for `test`: `PROPTEST_RNG_SEED`; else, under `CI` and not
/// exploring, the test's own fixed seed ([`fixed_seed`]); else a random one. The second
/// value says which.
fn seed(test: &str) -> (u64, &'static str) {
    if let Ok(s) = std::env::var("PROPTEST_RNG_SEED") {
        let seed = s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("PROPTEST_RNG_SEED={s:?}: expected a u64"));
        return (seed, "from PROPTEST_RNG_SEED");
    }
    let exploring = std::env::var_os("KEELSON_PROPTEST_EXPLORE").is_some();
    if crate::need::ci() && !exploring {
        return (fixed_seed(test), "fixed for this test, as CI is set");
    }
    use std::hash::{BuildHasher, Hasher};
    // std's per-process random keys: no extra dependency for 64 random bits.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    (h.finish(), "random")
}

/// A test's fixed seed: FNV-1a of its name (the same on every machine and toolchain, unlike
/// std's hashers), so each test has cases of its own and keeps them run after run.
pub fn fixed_seed(test: &str) -> u64 {
    test.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The default configuration (256 cases, or `PROPTEST_CASES`) with the seed printed.
pub fn config() -> Config {
    with_cases(Config::default().cases)
}

/// [`config`] with `cases` cases (unless `PROPTEST_CASES` says otherwise).
pub fn with_cases(cases: u32) -> Config {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("this test");
    let (seed, why) = seed(test);
    eprintln!("proptest: seed {seed} ({why}); rerun {test} with PROPTEST_RNG_SEED={seed}");
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

    /// Under CI a test's seed is its own and the same every run; a seed given wins. In a
    /// child process of this test binary, as the environment decides.
    #[test]
    fn ci_fixes_each_tests_seed() {
        if std::env::var_os("KEELSON_TESTKIT_CHILD").is_some() {
            let (a, _) = seed("some::test");
            let (b, _) = seed("some::test");
            let (other, _) = seed("some::other_test");
            println!("SEEDS {a} {b} {other}");
            return;
        }
        let run = |env: &[(&str, &str)]| {
            let me = std::env::current_exe().unwrap();
            let mut cmd = std::process::Command::new(me);
            cmd.args([
                "--exact",
                "proptest::tests::ci_fixes_each_tests_seed",
                "--nocapture",
            ])
            .env("KEELSON_TESTKIT_CHILD", "1")
            .env_remove("CI")
            .env_remove("PROPTEST_RNG_SEED")
            .env_remove("KEELSON_PROPTEST_EXPLORE")
            .envs(env.iter().copied());
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{out:?}");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix("SEEDS "))
                .unwrap_or_else(|| panic!("{text}"))
                .to_owned();
            line.split(' ')
                .map(|s| s.parse().unwrap())
                .collect::<Vec<u64>>()
        };
        let ci = run(&[("CI", "1")]);
        assert_eq!(
            ci,
            vec![
                fixed_seed("some::test"),
                fixed_seed("some::test"),
                fixed_seed("some::other_test")
            ]
        );
        assert_ne!(ci[0], ci[2], "two tests, one seed");
        assert_eq!(run(&[("CI", "1")]), ci, "another run, other seeds");
        assert_eq!(
            run(&[("CI", "1"), ("PROPTEST_RNG_SEED", "42")]),
            vec![42, 42, 42]
        );
        let exploring = run(&[("CI", "1"), ("KEELSON_PROPTEST_EXPLORE", "1")]);
        assert_ne!(
            exploring[0], ci[0],
            "exploring under CI kept the fixed seed"
        );
        assert_ne!(exploring[0], exploring[1], "exploring drew one seed twice");
        let laptop = run(&[]);
        assert_ne!(laptop[0], ci[0]);
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
