//! Copy requests waiting to be issued, highest priority first and first come first served
//! within a priority. A request issued in part goes back with its sequence number, so it
//! stays ahead of later requests of its priority but behind a more urgent one that arrived
//! meanwhile: at every chunk boundary the most urgent work is issued next.

use std::cmp::Reverse;
use std::collections::BTreeMap;

/// How urgent a copy is. High: a decode step's small uploads; Normal: user copies;
/// Low: model loading and eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Low,
    Normal,
    High,
}

impl Priority {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "low" => Some(Self::Low),
            "normal" => Some(Self::Normal),
            "high" => Some(Self::High),
            _ => None,
        }
    }
}

pub struct Queue<T> {
    items: BTreeMap<(Reverse<Priority>, u64), T>,
    next_seq: u64,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Self {
            items: BTreeMap::new(),
            next_seq: 0,
        }
    }
}

impl<T> Queue<T> {
    /// Queues `item`; returns its sequence number.
    pub fn push(&mut self, priority: Priority, item: T) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.items.insert((Reverse(priority), seq), item);
        seq
    }

    /// Puts back an item taken by pop, in its old place.
    pub fn put_back(&mut self, priority: Priority, seq: u64, item: T) {
        self.items.insert((Reverse(priority), seq), item);
    }

    /// The most urgent item, oldest first within a priority.
    pub fn pop(&mut self) -> Option<(Priority, u64, T)> {
        self.items
            .pop_first()
            .map(|((Reverse(p), seq), item)| (p, seq, item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn prio(i: u8) -> Priority {
        [Priority::Low, Priority::Normal, Priority::High][usize::from(i % 3)]
    }

    proptest! {
        /// Popping everything gives priority order, FIFO within a priority, and a put_back
        /// item comes out before every later item of its priority.
        #[test]
        fn pops_most_urgent_oldest_first(ps in proptest::collection::vec(0u8..3, 0..40),
                                         back in 0usize..40) {
            let mut q = Queue::default();
            for (i, &p) in ps.iter().enumerate() {
                q.push(prio(p), i);
            }
            let mut out = Vec::new();
            let mut put_back_done = false;
            while let Some((p, seq, i)) = q.pop() {
                if i == back && !put_back_done {
                    put_back_done = true;
                    q.put_back(p, seq, i);
                    continue;
                }
                out.push((p, i));
            }
            prop_assert_eq!(out.len(), ps.len());
            for w in out.windows(2) {
                prop_assert!(w[0].0 > w[1].0 || (w[0].0 == w[1].0 && w[0].1 < w[1].1));
            }
        }
    }

    #[test]
    fn parse_names() {
        assert_eq!(Priority::parse("high"), Some(Priority::High));
        assert_eq!(Priority::parse("low"), Some(Priority::Low));
        assert_eq!(Priority::parse("urgent"), None);
    }
}
