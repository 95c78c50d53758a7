use super::*;
use proptest::prelude::*;

const T: u64 = 1_000_000_000_000;
const MS: u64 = 1_000_000;

fn entry(container: u64, priority: i32) -> Entry {
    Entry { container, heartbeat_ns: T, priority, pid: 7, ..Entry::default() }
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vgpu-node-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const UUID: &str = "GPU-12345678-aaaa-bbbb-cccc-1234567890ab";

#[test]
fn layout_sizes() {
    assert_eq!(FILE_SIZE, 4160);
    assert_eq!(header().len(), HEADER_SIZE);
    assert_eq!(&header()[..8], b"LVGPUNOD");
}

#[test]
fn entry_round_trips_and_a_flipped_bit_is_corrupt() {
    let e = Entry { active_until_ns: T + 5, last_launch_ns: T - 3, cap: 50, soft_cap: 80, util_centi: 4200, ..entry(42, 3) };
    let b = e.encode();
    assert_eq!(Entry::decode(&b), Slot::Used(e));
    for bit in 0..ENTRY_SIZE * 8 {
        let mut c = b;
        c[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(Entry::decode(&c), Slot::Corrupt, "bit {bit}");
    }
    assert_eq!(Entry::decode(&[0u8; ENTRY_SIZE]), Slot::Free);
    assert_eq!(Entry::decode(&[0u8; 3]), Slot::Corrupt);
    assert_eq!(Entry::decode(&Entry { container: 0, ..e }.encode()), Slot::Corrupt);
}

#[test]
fn parse_wants_exact_size_and_header() {
    let mut f = vec![0u8; FILE_SIZE];
    assert!(parse(&f).is_err(), "all zero is not a file of ours");
    f[..HEADER_SIZE].copy_from_slice(&header());
    assert_eq!(parse(&f).unwrap(), vec![Slot::Free; ENTRIES]);
    f[HEADER_SIZE + ENTRY_SIZE..HEADER_SIZE + 2 * ENTRY_SIZE].copy_from_slice(&entry(9, 0).encode());
    assert_eq!(parse(&f).unwrap()[1], Slot::Used(entry(9, 0)));
    assert!(parse(&f[..FILE_SIZE - 1]).is_err());
    let mut g = f.clone();
    g.push(0);
    assert!(parse(&g).is_err());
    f[8] = 2; // another version
    assert!(parse(&f).is_err());
}

proptest! {
    #[test]
    fn entries_round_trip(c in 1u64.., hb: u64, au: u64, ll: u64, p: i32, cap: u32, soft: u32, u: u32, pid: u32) {
        let e = Entry { container: c, heartbeat_ns: hb, active_until_ns: au, last_launch_ns: ll, priority: p, cap, soft_cap: soft, util_centi: u, pid };
        prop_assert_eq!(Entry::decode(&e.encode()), Slot::Used(e));
    }

    #[test]
    fn any_bytes_parse_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..FILE_SIZE + 8), now: u64, me: u64, prio: i32) {
        let _ = Entry::decode(&bytes[..bytes.len().min(ENTRY_SIZE)]);
        if let Ok(slots) = parse(&bytes) {
            let _ = peers(&slots, me, prio, now);
            let _ = containers(&slots, now);
        }
        // A valid header with random entries: every entry is Free, Used with a valid check, or Corrupt.
        let mut f = bytes.clone();
        f.resize(FILE_SIZE, 0);
        f[..HEADER_SIZE].copy_from_slice(&header());
        let slots = parse(&f).unwrap();
        prop_assert_eq!(slots.len(), ENTRIES);
        let p = peers(&slots, me, prio, now);
        prop_assert!(p.others + p.corrupt <= ENTRIES);
    }

    /// Whatever the other entries say, a priority-0 container is never held, and nobody is held
    /// by an entry whose heartbeat stopped `STALE_NS` ago.
    #[test]
    fn liars_cost_at_most_the_priority_advantage(entries in proptest::collection::vec((1u64..5, any::<u64>(), any::<u64>(), any::<i32>()), 0..10), mine in 0i32..3) {
        let now = T;
        let slots: Vec<Slot> = entries.iter().map(|&(c, hb, au, p)| Slot::Used(Entry { container: c + 100, heartbeat_ns: hb, active_until_ns: au, priority: p, ..Entry::default() })).collect();
        let p = peers(&slots, 1, mine, now);
        if mine == 0 {
            prop_assert!(!p.higher && !p.higher_busy);
        }
        let stale: Vec<Slot> = slots.iter().map(|s| match s {
            Slot::Used(e) => Slot::Used(Entry { heartbeat_ns: now - STALE_NS - 1, ..*e }),
            s => *s,
        }).collect();
        prop_assert_eq!(peers(&stale, 1, mine, now), Peers::default());
    }
}

#[test]
fn peers_sees_higher_and_lower_busy_and_idle() {
    let now = T;
    let hi = Entry { active_until_ns: now + MS, ..entry(10, 0) };
    let lo = entry(20, 2);
    let me = 30;
    let slots = [Slot::Used(hi), Slot::Used(lo), Slot::Free, Slot::Corrupt, Slot::Used(entry(me, 1))];
    let p = peers(&slots, me, 1, now);
    assert!(p.higher && p.higher_busy && p.higher_working && p.lower && others_work(&slots, me, now));
    assert_eq!((p.others, p.corrupt), (2, 1));
    // The high one goes idle: no hold; still "higher" (keep gating, ready for its next request).
    let idle = Entry { active_until_ns: now, ..hi };
    let p = peers(&[Slot::Used(idle), Slot::Used(lo)], me, 1, now);
    assert!(p.higher && !p.higher_busy && p.higher_working && !others_work(&[Slot::Used(idle), Slot::Used(lo)], me, now), "its work just ended: it works lately");
    let idle = Entry { active_until_ns: 0, ..hi };
    let p = peers(&[Slot::Used(idle), Slot::Used(lo)], me, 1, now);
    assert!(p.higher && !p.higher_busy && !p.higher_working && !others_work(&[Slot::Used(idle), Slot::Used(lo)], me, now));
    // Between requests (nothing declared, a launch 10 ms or 4 s ago) it still works; a minute
    // later not.
    for ago in [10 * MS, 4_000 * MS] {
        let between = Entry { last_launch_ns: now - ago, ..idle };
        let p = peers(&[Slot::Used(between)], me, 1, now);
        assert!(p.higher && !p.higher_busy && p.higher_working && (ago > RECENT_NS || others_work(&[Slot::Used(between)], me, now)));
    }
    let long_ago = Entry { last_launch_ns: now - 60_000 * MS, ..idle };
    assert!(!peers(&[Slot::Used(long_ago)], me, 1, now).higher_working);
    // After a pause, a request's declared work ended 5 ms ago, before its owner's monitor
    // published the launch: still working (the next request of the burst meets a bound).
    let after_pause = Entry { last_launch_ns: now - 10_000 * MS, active_until_ns: now - 5 * MS, ..idle };
    assert!(peers(&[Slot::Used(after_pause)], me, 1, now).higher_working);
    let ended_long_ago = Entry { active_until_ns: now - ENGAGED_NS - 1, ..long_ago };
    assert!(!peers(&[Slot::Used(ended_long_ago)], me, 1, now).higher_working);
    // Our own container's other processes are not peers, whatever they say.
    let p = peers(&[Slot::Used(Entry { active_until_ns: now + MS, ..entry(me, 0) })], me, 1, now);
    assert_eq!(p, Peers::default());
    // Equal priority: neither holds the other.
    let equal = [Slot::Used(Entry { active_until_ns: now + MS, ..entry(10, 1) })];
    let p = peers(&equal, me, 1, now);
    assert!(!p.higher && !p.lower && others_work(&equal, me, now));
    // Out-of-range priorities are clamped: -5 is 0, which does not outrank our 0.
    let p = peers(&[Slot::Used(Entry { active_until_ns: now + MS, ..entry(10, -5) })], me, 0, now);
    assert!(!p.higher_busy);
}

#[test]
fn liveness_follows_the_heartbeat() {
    let e = entry(1, 0);
    assert!(live(&e, T));
    assert!(live(&e, T + STALE_NS));
    assert!(!live(&e, T + STALE_NS + 1));
    assert!(!live(&Entry { heartbeat_ns: T + FUTURE_NS + 1, ..e }, T), "a heartbeat from the future");
    assert!(claimable(&Slot::Free, T) && claimable(&Slot::Corrupt, T));
    assert!(!claimable(&Slot::Used(e), T));
    assert!(claimable(&Slot::Used(e), T + REAP_NS + 1));
}

/// Does another container of `slots` have work, as the soft cap sees it? (An uncapped one with
/// work leaves no room above a hard cap of 25.)
fn others_work(slots: &[Slot], me: u64, now: u64) -> bool {
    soft_ceiling(slots, me, (25, 60), now, Some(0)) < Some(100)
}

#[test]
fn soft_cap_follows_the_node_view_when_there_is_one() {
    assert_eq!(soft_ceiling_now(Some(40), true), 40);
    assert_eq!(soft_ceiling_now(Some(100), false), 100);
    assert_eq!(soft_ceiling_now(None, true), 100);
    assert_eq!(soft_ceiling_now(None, false), 0);
    let recent = Entry { last_launch_ns: T - RECENT_NS / 2, ..entry(5, 1) };
    assert!(others_work(&[Slot::Used(recent)], 1, T));
    let old = Entry { last_launch_ns: T - RECENT_NS - 1, ..entry(5, 1) };
    assert!(!others_work(&[Slot::Used(old)], 1, T));
}

#[test]
fn the_soft_cap_reaches_as_far_as_the_others_with_work_leave_room() {
    let busy = |c: u64, cap: u32, soft: u32| Slot::Used(Entry { cap, soft_cap: soft, active_until_ns: T + MS, ..entry(c, 1) });
    let me = 20;
    // Alone, or beside containers without work: all of it.
    assert_eq!(soft_ceiling(&[], me, (25, 60), T, Some(0)), Some(100));
    assert_eq!(soft_ceiling(&[Slot::Used(entry(10, 1)), Slot::Free, Slot::Corrupt], me, (25, 60), T, Some(0)), Some(100));
    // Beside one alike: half of what the hard caps leave each, whichever id is lower.
    assert_eq!(soft_ceiling(&[busy(10, 25, 60)], me, (25, 60), T, Some(0)), Some(50));
    assert_eq!(soft_ceiling(&[busy(30, 25, 60)], me, (25, 60), T, Some(0)), Some(50));
    // Beside one capped 30 without a soft cap: our soft cap; beside an uncapped one: our hard cap.
    assert_eq!(soft_ceiling(&[busy(10, 30, 0)], me, (25, 60), T, Some(0)), Some(60));
    assert_eq!(soft_ceiling(&[busy(10, 0, 0)], me, (25, 60), T, Some(0)), Some(25));
    // A container's processes count once, by their largest caps (an uncapped one: the GPU).
    assert_eq!(soft_ceiling(&[busy(10, 25, 60), busy(10, 25, 60)], me, (25, 60), T, Some(0)), Some(50));
    assert_eq!(soft_ceiling(&[busy(10, 25, 60), busy(10, 0, 0)], me, (25, 60), T, Some(0)), Some(25));
    // Our own container's other processes are not others; a stale entry is not there.
    assert_eq!(soft_ceiling(&[busy(me, 25, 60)], me, (25, 60), T, Some(0)), Some(100));
    let stale = Slot::Used(Entry { heartbeat_ns: T - STALE_NS - 1, ..match busy(10, 0, 0) { Slot::Used(e) => e, _ => unreachable!() } });
    assert_eq!(soft_ceiling(&[stale], me, (25, 60), T, Some(0)), Some(100));
    // NVML lists more compute processes than the file has live entries (a tenant the file does
    // not see), or cannot say: no share by the file (the rule without one applies).
    let two = [busy(10, 25, 60), Slot::Used(Entry { cap: 25, soft_cap: 60, ..entry(me, 1) })];
    assert_eq!(soft_ceiling(&two, me, (25, 60), T, Some(2)), Some(50));
    assert_eq!(soft_ceiling(&two, me, (25, 60), T, Some(3)), None, "a third process on the GPU, not in the file");
    assert_eq!(soft_ceiling(&two, me, (25, 60), T, None), None, "NVML cannot list the processes");
    assert!(accounts_for(&two, Some(1), T) && accounts_for(&two, Some(2), T) && !accounts_for(&[stale], Some(1), T));
}

#[test]
fn declared_work_is_bounded() {
    assert_eq!(declare_until(T, 2 * MS), T + 2 * MS + DECLARE_SLACK_NS);
    assert_eq!(declare_until(T, u64::MAX), T + MAX_DECLARE_NS + DECLARE_SLACK_NS);
}

#[test]
fn containers_merge_processes_of_one_container() {
    let a1 = Entry { util_centi: 3000, cap: 50, ..entry(1, 1) };
    let a2 = Entry { active_until_ns: T + MS, util_centi: 20_000, ..entry(1, 1) };
    let b = entry(2, 0);
    let dead = Entry { heartbeat_ns: T - STALE_NS - 1, ..entry(3, 0) };
    let v = containers(&[Slot::Used(a1), Slot::Used(a2), Slot::Used(b), Slot::Used(dead), Slot::Corrupt], T);
    assert_eq!(v.len(), 2);
    assert_eq!((v[0].container, v[0].priority), (2, 0));
    assert_eq!((v[1].processes, v[1].util_centi, v[1].busy, v[1].cap), (2, 10_000, true, 50));
}

#[test]
fn names_and_dirs() {
    assert_eq!(file_name(UUID).unwrap(), format!("{UUID}.node"));
    for bad in ["", "../x", "a/b", "GPU x", &"a".repeat(97)] {
        assert_eq!(file_name(bad), None, "{bad:?}");
    }
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    assert_eq!(dir_from(None), Some(PathBuf::from(DEFAULT_DIR)));
    assert_eq!(dir_from(Some(OsStr::new(""))), None);
    assert_eq!(dir_from(Some(OsStr::new("/x"))), Some(PathBuf::from("/x")));
    assert_eq!(dir_from(Some(OsStr::from_bytes(b"/x\xff"))), Some(PathBuf::from(OsStr::from_bytes(b"/x\xff"))));
    assert_ne!(container_id(1, 2), container_id(1, 3));
    assert_ne!(container_id(0, 0), 0);
}

#[test]
fn open_creates_reopens_and_refuses_what_is_not_ours() {
    let d = tmpdir("open");
    assert!(matches!(NodeFile::open(&d.join("absent"), UUID, true), Err(NodeError::NoDir)));
    assert!(!d.join("absent").exists());
    let f = NodeFile::open(&d, UUID, true).unwrap();
    assert_eq!(std::fs::metadata(&f.path).unwrap().len(), FILE_SIZE as u64);
    assert_eq!(f.read().unwrap(), vec![Slot::Free; ENTRIES]);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&f.path).unwrap().permissions().mode() & 0o777, 0o666);
    let r = NodeFile::open(&d, UUID, false).unwrap();
    assert!(f.write(3, &entry(5, 0)));
    assert_eq!(r.read().unwrap()[3], Slot::Used(entry(5, 0)));
    let path = f.path.clone();
    drop((f, r));

    let refuse = |what: &str| match NodeFile::open(&d, UUID, true) {
        Err(NodeError::Refused(m)) => assert!(m.contains("node file"), "{what}: {m}"),
        Err(NodeError::NoDir) => panic!("{what}: NoDir"),
        Ok(_) => panic!("{what}: accepted"),
    };
    let valid = std::fs::read(&path).unwrap();
    std::fs::write(&path, vec![0xa5u8; FILE_SIZE]).unwrap();
    refuse("garbage");
    assert!(std::fs::read(&path).unwrap() == vec![0xa5u8; FILE_SIZE], "garbage was changed");
    std::fs::write(&path, b"short").unwrap();
    refuse("short");
    std::fs::remove_file(&path).unwrap();
    let target = d.join("target");
    std::fs::write(&target, &valid).unwrap();
    std::os::unix::fs::symlink(&target, &path).unwrap();
    refuse("symlink");
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    refuse("directory");
    std::fs::remove_dir(&path).unwrap();
    // A symlinked directory.
    let link = d.join("linkdir");
    std::os::unix::fs::symlink(&d, &link).unwrap();
    assert!(matches!(NodeFile::open(&link, UUID, true), Err(NodeError::Refused(_))));
    // An empty file (a creator died before sizing it) is initialized.
    std::fs::write(&path, b"").unwrap();
    assert!(NodeFile::open(&d, UUID, true).is_ok());
    let fresh = std::fs::read(&path).unwrap();
    assert!(fresh.len() == FILE_SIZE && fresh[..HEADER_SIZE] == header() && fresh[HEADER_SIZE..].iter().all(|&b| b == 0));
    assert!(NodeFile::open(&d, "bad/uuid", true).is_err());
    let _ = std::fs::remove_dir_all(&d);
}

/// A file this uid may not open (another tenant's 0644 or 000): the line says which access it
/// lacks; other errors are said as they are.
#[test]
fn a_permission_refusal_names_the_uid_and_the_access() {
    let denied = io::Error::from_raw_os_error(libc::EACCES);
    assert_eq!(open_failure(&denied, true, 65534), format!("uid 65534 may not read and write it ({denied})"));
    assert_eq!(open_failure(&denied, false, 65534), format!("uid 65534 may not read it ({denied})"));
    let busy = io::Error::from_raw_os_error(libc::ETXTBSY);
    assert_eq!(open_failure(&busy, true, 0), busy.to_string());
}

#[test]
fn truncated_under_us_is_an_error_not_a_crash() {
    let d = tmpdir("trunc");
    let f = NodeFile::open(&d, UUID, true).unwrap();
    std::fs::OpenOptions::new().write(true).open(&f.path).unwrap().set_len(100).unwrap();
    assert!(f.read().is_err());
    assert!(!f.write(70, &entry(1, 0)));
    // Said as what it is, not as "no free entry".
    assert_eq!(f.claim(T), Err("truncated (100 bytes)".to_string()));
    let _ = std::fs::remove_dir_all(&d);
}

/// `: > file` (or `truncate -s 0`) under running owners: their next heartbeat writes past the
/// end, leaving zeros up to their entry. That left a file of the wrong size which every newcomer
/// refused until someone deleted it (hostile review): it is ours cut short, sized again.
#[test]
fn a_file_truncated_under_its_owners_is_sized_again_not_refused_for_good() {
    let d = tmpdir("cut");
    let f = NodeFile::open(&d, UUID, true).unwrap();
    std::fs::OpenOptions::new().write(true).open(&f.path).unwrap().set_len(0).unwrap();
    assert!(f.write(5, &entry(9, 1)), "an owner's heartbeat after the truncation");
    assert_eq!(std::fs::metadata(&f.path).unwrap().len(), (HEADER_SIZE + 6 * ENTRY_SIZE) as u64);
    assert!(f.read().is_err());
    assert!(NodeFile::open(&d, UUID, false).is_err(), "a reader (vgpu-smi) changes nothing");
    let g = NodeFile::open(&d, UUID, true).expect("a newcomer sizes the truncated file again");
    assert_eq!(g.read().unwrap()[5], Slot::Used(entry(9, 1)), "the owner's entry is kept");
    assert!(f.read().is_ok());
    // Cut short with a header that is not all zeros: not known to be ours, refused as before.
    std::fs::OpenOptions::new().write(true).open(&f.path).unwrap().set_len(100).unwrap();
    assert!(NodeFile::open(&d, UUID, true).is_err());
    assert_eq!(std::fs::metadata(&f.path).unwrap().len(), 100);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn an_owner_repairs_a_cut_file_and_sees_a_deleted_or_moved_one() {
    let d = tmpdir("repair");
    let f = NodeFile::open(&d, UUID, true).unwrap();
    assert!(!f.replaced() && !f.repair(), "intact");
    std::fs::OpenOptions::new().write(true).open(&f.path).unwrap().set_len(0).unwrap();
    assert!(f.read().is_err());
    assert!(f.repair());
    assert_eq!(f.read().unwrap(), vec![Slot::Free; ENTRIES]);
    std::fs::remove_file(&f.path).unwrap();
    assert!(f.replaced(), "deleted");
    std::fs::write(&f.path, vec![0u8; FILE_SIZE]).unwrap();
    assert!(f.replaced(), "another file in its place");
    let _ = std::fs::remove_dir_all(&d);
}

/// A FIFO, a directory or a huge sparse file where the node file should be: refused at once
/// (a FIFO opened without `O_NONBLOCK` for reading would wait for a writer forever).
#[test]
fn a_fifo_or_huge_file_in_its_place_is_refused_without_waiting() {
    let d = tmpdir("fifo");
    let path = d.join(file_name(UUID).unwrap());
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    for write in [true, false] {
        assert!(matches!(NodeFile::open(&d, UUID, write), Err(NodeError::Refused(_))), "fifo, write {write}");
    }
    std::fs::remove_file(&path).unwrap();
    std::fs::File::create(&path).unwrap().set_len(10 << 30).unwrap();
    for write in [true, false] {
        assert!(matches!(NodeFile::open(&d, UUID, write), Err(NodeError::Refused(_))), "huge, write {write}");
    }
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 10 << 30);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn claims_are_exclusive_and_dead_owners_are_reaped() {
    let d = tmpdir("claim");
    let a = NodeFile::open(&d, UUID, true).unwrap();
    let b = NodeFile::open(&d, UUID, true).unwrap();
    let ia = a.claim(T).unwrap().unwrap();
    let ib = b.claim(T).unwrap().unwrap();
    assert_ne!(ia, ib);
    assert!(a.write(ia, &entry(1, 0)) && b.write(ib, &entry(2, 1)));
    assert_eq!(b.reap(Some(ib)), 0, "a's owner is alive");
    drop(a); // the owner goes away: its lock byte is free
    assert_eq!(b.reap(Some(ib)), 1);
    let slots = b.read().unwrap();
    assert_eq!((slots[ia], slots[ib]), (Slot::Free, Slot::Used(entry(2, 1))));
    // A live-looking entry left by a process that wrote without a lock is taken only when old.
    let c = NodeFile::open(&d, UUID, true).unwrap();
    for i in 0..ENTRIES {
        if i != ib {
            assert!(c.write(i, &entry(50 + i as u64, 0)));
        }
    }
    assert_eq!(c.claim(T), Ok(None), "every other entry looks alive");
    assert!(c.claim(T + REAP_NS + 1).unwrap().is_some());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn capped_containers_of_one_priority_take_turns_by_cap() {
    let now = T;
    let capped = |c: u64, cap: u32| Slot::Used(Entry { cap, last_launch_ns: now - MS, ..entry(c, 1) });
    // Alone, or uncapped ourselves: no turns.
    assert_eq!(turn(&[], 30, 1, (Some(50), None), true, now), None);
    assert_eq!(turn(&[capped(10, 50)], 30, 1, (None, None), true, now), None);
    // 50/50: the lower container id first.
    let slots = [capped(10, 50), capped(30, 50)];
    assert_eq!(turn(&slots, 10, 1, (Some(50), None), true, now), Some(Turn { offset_ns: 0, len_ns: TURN_PERIOD_NS / 2 }));
    assert_eq!(turn(&slots, 30, 1, (Some(50), None), true, now), Some(Turn { offset_ns: TURN_PERIOD_NS / 2, len_ns: TURN_PERIOD_NS / 2 }));
    // 30/60: a tenth of the period is nobody's. Caps adding up past 100: no turns (an entry
    // claiming cap 99 must not shrink our part below our cap).
    let t = turn(&[capped(10, 30)], 30, 1, (Some(60), None), true, now).unwrap();
    assert_eq!((t.offset_ns, t.len_ns), (TURN_PERIOD_NS * 3 / 10, TURN_PERIOD_NS * 6 / 10));
    assert_eq!(turn(&[capped(10, 99)], 30, 1, (Some(50), None), true, now), None);
    // Soft caps: what the hard caps leave is shared (25/60 and 25/60: half the period each);
    // one without a soft cap keeps its hard cap's part, the other takes the rest up to its soft
    // cap (30 and 25/60: 60).
    let soft = |c: u64, cap: u32, soft_cap: u32| Slot::Used(Entry { cap, soft_cap, last_launch_ns: now - MS, ..entry(c, 1) });
    assert_eq!(turn(&[soft(10, 25, 60)], 30, 1, (Some(25), Some(60)), true, now), Some(Turn { offset_ns: TURN_PERIOD_NS / 2, len_ns: TURN_PERIOD_NS / 2 }));
    assert_eq!(turn(&[soft(30, 25, 60)], 10, 1, (Some(25), Some(60)), true, now), Some(Turn { offset_ns: 0, len_ns: TURN_PERIOD_NS / 2 }));
    let t = turn(&[soft(10, 30, 0)], 30, 1, (Some(25), Some(60)), true, now).unwrap();
    assert_eq!((t.offset_ns, t.len_ns), (TURN_PERIOD_NS * 3 / 10, TURN_PERIOD_NS * 6 / 10));
    // Where the file does not account for the GPU, the hard caps' parts only.
    let t = turn(&[soft(10, 25, 60)], 30, 1, (Some(25), Some(60)), false, now).unwrap();
    assert_eq!((t.offset_ns, t.len_ns), (TURN_PERIOD_NS / 4, TURN_PERIOD_NS / 4));
    // Not partners: another priority, uncapped, idle for a while, stale, or our own container.
    let other_prio = Slot::Used(Entry { cap: 50, last_launch_ns: now - MS, ..entry(10, 0) });
    let uncapped = Slot::Used(Entry { cap: 0, last_launch_ns: now - MS, ..entry(11, 1) });
    let idle = Slot::Used(Entry { cap: 50, last_launch_ns: now - TURN_RECENT_NS - 1, ..entry(12, 1) });
    let stale = Slot::Used(Entry { cap: 50, last_launch_ns: now - MS, heartbeat_ns: now - STALE_NS - 1, ..entry(13, 1) });
    let own = capped(30, 50);
    assert_eq!(turn(&[other_prio, uncapped, idle, stale, own], 30, 1, (Some(50), None), true, now), None);
    // Waiting for our part (launches go TURN_LEAD_NS ahead of it): none inside, up to its start
    // outside.
    let t = Turn { offset_ns: 10 * MS, len_ns: 20 * MS };
    let base = T - T % TURN_PERIOD_NS - TURN_LEAD_NS;
    assert_eq!(t.wait_ns(base + 15 * MS), 0);
    assert_eq!(t.wait_ns(base + 10 * MS), 0, "work is queued just before our part");
    assert_eq!(t.wait_ns(base + 5 * MS), 5 * MS);
    assert_eq!(t.wait_ns(base + 30 * MS), TURN_PERIOD_NS - 20 * MS, "and stops as long before it ends");
}

#[test]
fn a_lower_priority_queue_is_bounded_unless_the_gpu_switches_away_from_all_of_it() {
    for (all_set, shared, working) in [(false, false, false), (true, true, true), (true, false, true)] {
        assert_eq!(lower_queue_ns(false, all_set, shared, working), None, "no higher priority: nothing to bound");
    }
    // Some group at libcuda's 1-2 ms: a higher-priority request waits behind what is queued.
    assert_eq!(lower_queue_ns(true, false, false, false), Some(LOWER_QUEUE_NS));
    assert_eq!(lower_queue_ns(true, false, true, true), Some(LOWER_QUEUE_NS));
    const { assert!(LOWER_QUEUE_NS <= 250_000) };
    // Every group short: the GPU switches within the timeslice, whatever is queued.
    assert_eq!(lower_queue_ns(true, true, false, true), None);
    assert_eq!(lower_queue_ns(true, true, false, false), None);
    const { assert!(LOWER_TIMESLICE_US * 1000 < LOWER_QUEUE_NS) };
    // Every group at the shared timeslice: bounded while the higher priority has work, free
    // while it is idle (its first request waits about one shared timeslice per such context).
    assert_eq!(lower_queue_ns(true, true, true, true), Some(LOWER_QUEUE_NS));
    assert_eq!(lower_queue_ns(true, true, true, false), None);
}

#[test]
fn only_one_process_without_higher_priority_work_beside_it_runs_the_short_timeslice() {
    let now = T;
    let nobody = |_: usize| false;
    let working = |c, p| Entry { last_launch_ns: now - MS, ..entry(c, p) };
    let idle = |c, p| Entry { last_launch_ns: now - RECENT_NS - 1, ..entry(c, p) };
    let may = |slots: &[Slot], mine, prio| may_shorten(slots, mine, prio, now, nobody);
    // Beside a higher-priority container, busy or not, and an idle one of our priority: short.
    let slots = [Slot::Used(working(1, 0)), Slot::Used(idle(2, 1)), Slot::Used(working(3, 1)), Slot::Corrupt, Slot::Free];
    assert!(may(&slots, 2, 1));
    // Another training of our priority has work: two short contexts would switch between each
    // other every timeslice; neither shortens.
    let two = [Slot::Used(working(1, 0)), Slot::Used(working(2, 1)), Slot::Used(working(3, 1))];
    assert!(!may(&two, 1, 1) && !may(&two, 2, 1));
    // A lower priority with work counts too (it would be short beside its own higher ones).
    assert!(!may(&[Slot::Used(working(3, 1)), Slot::Used(working(4, 2))], 0, 1));
    // Another process of our own container has its own context: it counts.
    assert!(!may(&[Slot::Used(working(3, 1)), Slot::Used(working(3, 1))], 0, 1));
    // Declared work or utilization (from 5%) is work; a dead entry or a launch dated in the
    // future (a liar, another clock) is not.
    let with = |e: Entry| [Slot::Used(e), Slot::Used(working(3, 1))];
    assert!(!may(&with(Entry { active_until_ns: now + MS, ..idle(2, 1) }), 1, 1));
    assert!(!may(&with(Entry { util_centi: 500, ..idle(2, 1) }), 1, 1));
    assert!(may(&with(Entry { util_centi: 499, ..idle(2, 1) }), 1, 1));
    assert!(may(&with(Entry { heartbeat_ns: now - STALE_NS - 1, ..working(2, 1) }), 1, 1));
    assert!(may(&with(Entry { last_launch_ns: now + MS, ..idle(2, 1) }), 1, 1));
    // Priorities are clamped as everywhere: -5 is 0, not above our 0; 5000 is 1000, as is ours.
    assert!(!may(&[Slot::Used(working(1, -5)), Slot::Used(working(3, 0))], 1, 0));
    assert!(!may(&[Slot::Used(working(1, 1000)), Slot::Used(working(3, 5000))], 1, 5000));
    assert!(may(&[Slot::Used(working(1, 999)), Slot::Used(working(3, 5000))], 1, 5000));
}

#[test]
fn a_slot_held_by_a_live_owner_blocks_the_short_timeslice_whatever_it_says() {
    let now = T;
    let me = Entry { last_launch_ns: now - MS, ..entry(3, 1) };
    let hb = now - STALE_NS - 1;
    let frozen = Entry { heartbeat_ns: hb, last_launch_ns: hb - MS, ..entry(2, 1) };
    // A tenant zeroed or garbled a live victim's entry, or its owner froze (stale heartbeat)
    // while it had work: its lock byte is still held, so it may still run short beside us.
    for other in [Slot::Free, Slot::Corrupt, Slot::Used(frozen)] {
        let slots = [Slot::Used(me), other];
        assert!(!may_shorten(&slots, 0, 1, now, |i| i == 1), "{other:?} held by a live owner");
        assert!(may_shorten(&slots, 0, 1, now, |_| false), "{other:?} with its owner gone");
    }
    // A stale entry that was idle at its last heartbeat, or of a higher priority, blocks nothing
    // even while held (an orphaned child keeping the descriptor, a detached owner).
    let idle = Entry { last_launch_ns: hb - RECENT_NS - 1, ..frozen };
    let higher = Entry { priority: 0, ..frozen };
    for other in [idle, higher] {
        assert!(may_shorten(&[Slot::Used(me), Slot::Used(other)], 0, 1, now, |_| true), "{other:?}");
    }
    // Our own slot is never asked about.
    assert!(may_shorten(&[Slot::Used(me)], 0, 1, now, |i| panic!("asked about {i}")));
}

#[test]
fn each_entry_carries_its_own_process_work_not_its_containers() {
    let now = T;
    // An idle process of a busy container: the container's utilization is not written into its
    // entry, so it does not keep the container's working process from shortening.
    let (last, util) = own_activity(0, 0, 9000, now);
    assert_eq!((last, util), (0, 0));
    let idle_sibling = Entry { last_launch_ns: last, util_centi: util, ..entry(3, 1) };
    let (last, util) = own_activity(0, now - MS, 9000, now);
    assert_eq!((last, util), (now - MS, 9000));
    let trainer = Entry { last_launch_ns: last, util_centi: util, ..entry(3, 1) };
    let slots = [Slot::Used(entry(1, 0)), Slot::Used(trainer), Slot::Used(idle_sibling)];
    assert!(may_shorten(&slots, 1, 1, now, |_| false));
    assert!(!may_shorten(&slots, 2, 1, now, |_| false), "the sibling itself sees the trainer");
    // The latest launch never moves back; the utilization goes with a launch 2 s old.
    assert_eq!(own_activity(now - MS, now - 5 * MS, 100, now).0, now - MS);
    assert_eq!(own_activity(now - 2_000 * MS, 0, 20_000, now), (now - 2_000 * MS, 10_000));
    assert_eq!(own_activity(now - 2_001 * MS, 0, 20_000, now).1, 0);
    // The container's view still sees its latest launch through the working process's entry.
    let v = containers(&slots, now);
    assert!(v.iter().any(|c| c.container == 3 && c.last_launch_ns == now - MS && c.util_centi == 9000));
}

#[test]
fn groups_shorten_only_where_every_gpu_the_process_works_on_allows_it() {
    let g = |higher, active, may| GpuView { higher, active, may };
    assert!(!shorten_everywhere(&[]), "no GPU");
    assert!(shorten_everywhere(&[g(true, true, Some(true))]));
    assert!(shorten_everywhere(&[g(true, false, Some(true))]), "nothing queued yet: ready for the first launch");
    assert!(!shorten_everywhere(&[g(false, true, Some(true))]), "no higher priority anywhere");
    assert!(!shorten_everywhere(&[g(true, true, Some(false))]));
    // The groups are not told apart by GPU: a GPU we work on where another process has work,
    // or one without a node entry (nobody there sees us), keeps them all at libcuda's.
    assert!(!shorten_everywhere(&[g(true, true, Some(true)), g(false, true, Some(false))]));
    assert!(!shorten_everywhere(&[g(true, true, Some(true)), g(false, true, None)]));
    assert!(shorten_everywhere(&[g(true, true, Some(true)), g(false, true, Some(true))]));
    // A GPU we do not work on (another data-parallel rank's) has no say.
    assert!(shorten_everywhere(&[g(true, true, Some(true)), g(true, false, Some(false)), g(false, false, None)]));
}

#[test]
fn a_lower_priority_process_that_may_not_run_the_short_timeslice_runs_the_shared_one() {
    let g = |higher, active, may| GpuView { higher, active, may };
    assert_eq!(group_timeslice_us(&[]), None);
    assert_eq!(group_timeslice_us(&[g(false, true, Some(true))]), None, "no higher priority: libcuda's");
    assert_eq!(group_timeslice_us(&[g(false, true, Some(false))]), None);
    assert_eq!(group_timeslice_us(&[g(true, true, Some(true))]), Some(LOWER_TIMESLICE_US));
    // Another process without higher priority works there (or nobody could tell): not the short
    // timeslice, which two such processes would both run, but one between it and libcuda's.
    assert_eq!(group_timeslice_us(&[g(true, true, Some(false))]), Some(SHARED_TIMESLICE_US));
    assert_eq!(group_timeslice_us(&[g(true, true, Some(true)), g(false, true, None)]), Some(SHARED_TIMESLICE_US));
    // The higher priority is only on a GPU we do not work on, and our GPU carries an
    // equal-priority peer: libcuda's, as that peer runs.
    assert_eq!(group_timeslice_us(&[g(true, false, Some(true)), g(false, true, Some(false))]), None);
    const { assert!(LOWER_TIMESLICE_US < SHARED_TIMESLICE_US && SHARED_TIMESLICE_US < 1024) };
}

#[test]
fn a_process_s_own_launch_is_dated_on_the_gpu_it_went_to() {
    let now = T;
    // Gated launches know their GPU.
    assert_eq!(own_last_launch(now - MS, false, false, true, now), now - MS);
    // Ungated ones: on the only GPU, or on every GPU of a process with no gated launches.
    assert_eq!(own_last_launch(0, true, true, false, now), now);
    assert_eq!(own_last_launch(0, true, false, false, now), now);
    // A gated multi-GPU process's LAUNCHED flag says nothing of which GPU.
    assert_eq!(own_last_launch(now - 5 * MS, true, false, true, now), now - 5 * MS);
    assert_eq!(own_last_launch(now - 5 * MS, true, true, true, now), now);
    assert_eq!(own_last_launch(0, false, true, false, now), 0);
}

/// A FIFO where the node file should be is refused without being opened (its open would wake a
/// writer blocked on it; a device's open can act).
#[test]
fn a_fifo_in_its_place_is_never_opened() {
    let d = tmpdir("fifo-open");
    let w = crate::regular::testing::BlockedWriter::at(&d.join(file_name(UUID).unwrap()));
    for write in [true, false] {
        assert!(matches!(NodeFile::open(&d, UUID, write), Err(NodeError::Refused(_))), "fifo, write {write}");
    }
    assert!(w.still_blocked(), "the FIFO at the node file's path was opened");
    drop(w);
    let _ = std::fs::remove_dir_all(&d);
}

/// A node file opened for writing has all its blocks, so writing an entry cannot meet a full
/// disk later (hostile round 3: a sparse file's entry write failed with ENOSPC, unsaid): a new
/// file, and a sparse one of the right size and header made elsewhere.
#[test]
fn a_file_opened_for_writing_holds_every_block() {
    use std::os::unix::fs::MetadataExt;
    let d = tmpdir("blocks");
    let path = d.join(file_name(UUID).unwrap());
    let allocated = || std::fs::metadata(&path).unwrap().blocks() * 512 >= FILE_SIZE as u64;
    drop(NodeFile::open(&d, UUID, true).unwrap());
    assert!(allocated(), "a new file is sparse");
    std::fs::remove_file(&path).unwrap();
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(FILE_SIZE as u64).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &header(), 0).unwrap();
    assert!(!allocated(), "the filesystem allocated a sparse file's holes: the test shows nothing here");
    drop(NodeFile::open(&d, UUID, false).unwrap());
    assert!(!allocated(), "a reader changed the file");
    drop(NodeFile::open(&d, UUID, true).unwrap());
    assert!(allocated(), "a sparse file was left sparse by a writer");
    let _ = std::fs::remove_dir_all(&d);
}
