//! Whom a client's requests are made for. By default the process's own effective user,
//! group and supplementary groups; code that sends requests on behalf of someone else (the
//! FUSE mount, for the process that made a system call) says so on its thread with
//! [`act_as`] for as long as the returned guard lives.

use std::cell::RefCell;

use crate::proto::Caller;

thread_local! {
    static ACTING_FOR: RefCell<Option<Caller>> = const { RefCell::new(None) };
}

/// While alive, requests this thread sends are made for its caller; dropping it restores
/// what was in effect before.
#[must_use = "the caller applies only while the guard lives"]
#[derive(Debug)]
pub struct ActingAs {
    before: Option<Caller>,
}

/// Makes the requests this thread sends, until the guard is dropped, on behalf of `caller`.
pub fn act_as(caller: Caller) -> ActingAs {
    let before = ACTING_FOR.with(|a| a.borrow_mut().replace(caller));
    ActingAs { before }
}

impl Drop for ActingAs {
    fn drop(&mut self) {
        let before = self.before.take();
        ACTING_FOR.with(|a| *a.borrow_mut() = before);
    }
}

/// The caller of a request sent now from this thread.
pub(crate) fn current() -> Caller {
    ACTING_FOR
        .with(|a| a.borrow().clone())
        .unwrap_or_else(Caller::of_process)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acting_as_nests_and_restores() {
        assert_eq!(current(), Caller::of_process());
        {
            let _a = act_as(Caller::new(5, 6, vec![7]));
            assert_eq!(current(), Caller::new(5, 6, vec![7]));
            {
                let _b = act_as(Caller::new(8, 9, vec![]));
                assert_eq!(current().uid, 8);
            }
            assert_eq!(current().uid, 5);
            // Other threads are not affected.
            let other = std::thread::spawn(current).join().unwrap();
            assert_eq!(other, Caller::of_process());
        }
        assert_eq!(current(), Caller::of_process());
    }
}
