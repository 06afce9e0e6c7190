use super::*;

#[test]
fn monotonic_timestamps_of_journal_lines() {
    assert_eq!(
        monotonic("[    4.123456] master-0 ignition[312]: Ignition 2.14.0"),
        Some(4.123456)
    );
    assert_eq!(monotonic("-- No entries --"), None);
    assert_eq!(monotonic("[abc] x"), None);
}
