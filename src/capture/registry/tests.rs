use super::*;

#[test]
fn the_collector_looks_only_at_slots_up_to_the_highest_ever_claimed() {
    static TABLE: Registry = Registry::new();
    assert!(TABLE.claimed().is_empty());
    assert_eq!(TABLE.claim(), Some(0));
    assert_eq!(TABLE.claim(), Some(1));
    assert_eq!(TABLE.claimed().len(), 2);
    // A slot handed back stays in view (a last drain may still be due), and the next claim
    // takes it again rather than a new one.
    TABLE.retire(0);
    TABLE.free(0);
    assert_eq!(TABLE.claimed().len(), 2);
    assert_eq!(TABLE.claimed()[0].state(), SlotState::Free);
    assert_eq!(TABLE.claim(), Some(0));
    assert_eq!(TABLE.claimed().len(), 2);
    assert_eq!(TABLE.claim(), Some(2));
    assert_eq!(TABLE.claimed().len(), 3);
    assert!(TABLE.slots()[3..]
        .iter()
        .all(|slot| slot.state() == SlotState::Free));
}
