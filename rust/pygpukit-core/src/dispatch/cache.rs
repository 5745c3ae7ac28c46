//! A bounded map with least-recently-used eviction, O(1) per operation: a
//! hash map from key to slot and a doubly linked list of slots by recency.

use std::collections::HashMap;
use std::hash::Hash;

const NIL: usize = usize::MAX;

struct Slot<K, V> {
    key: K,
    value: V,
    prev: usize, // towards the most recently used
    next: usize, // towards the least recently used
}

pub struct LruCache<K, V> {
    map: HashMap<K, usize>,
    slots: Vec<Option<Slot<K, V>>>,
    free: Vec<usize>,
    head: usize, // most recently used
    tail: usize, // least recently used
    capacity: usize,
    evictions: u64,
}

impl<K: Hash + Eq + Clone, V> LruCache<K, V> {
    /// At most `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            map: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            capacity: capacity.max(1),
            evictions: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries dropped to stay within the capacity so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// The value, made the most recently used.
    pub fn get(&mut self, key: &K) -> Option<&V> {
        let i = *self.map.get(key)?;
        self.touch(i);
        self.slots[i].as_ref().map(|s| &s.value)
    }

    pub fn contains(&self, key: &K) -> bool {
        self.map.contains_key(key)
    }

    /// Inserts or replaces; returns the entry evicted to make room, if any.
    pub fn insert(&mut self, key: K, value: V) -> Option<(K, V)> {
        if let Some(&i) = self.map.get(&key) {
            if let Some(s) = self.slots[i].as_mut() {
                s.value = value;
            }
            self.touch(i);
            return None;
        }
        let evicted = if self.map.len() >= self.capacity {
            self.pop_lru()
        } else {
            None
        };
        let slot = Slot {
            key: key.clone(),
            value,
            prev: NIL,
            next: self.head,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        if self.head != NIL {
            self.link_mut(self.head).prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
        self.map.insert(key, i);
        evicted
    }

    pub fn remove(&mut self, key: &K) -> Option<V> {
        let i = self.map.remove(key)?;
        self.unlink(i);
        self.free.push(i);
        self.slots[i].take().map(|s| s.value)
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.slots.clear();
        self.free.clear();
        self.head = NIL;
        self.tail = NIL;
    }

    /// Keys from the most to the least recently used.
    pub fn keys_by_recency(&self) -> Vec<K> {
        let mut out = Vec::with_capacity(self.map.len());
        let mut i = self.head;
        while i != NIL {
            let s = self.slots[i].as_ref().expect("linked slot is live");
            out.push(s.key.clone());
            i = s.next;
        }
        out
    }

    fn pop_lru(&mut self) -> Option<(K, V)> {
        let i = self.tail;
        if i == NIL {
            return None;
        }
        self.unlink(i);
        self.free.push(i);
        let s = self.slots[i].take()?;
        self.map.remove(&s.key);
        self.evictions += 1;
        Some((s.key, s.value))
    }

    fn link_mut(&mut self, i: usize) -> &mut Slot<K, V> {
        self.slots[i].as_mut().expect("linked slot is live")
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = {
            let s = self.link_mut(i);
            (s.prev, s.next)
        };
        if prev != NIL {
            self.link_mut(prev).next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.link_mut(next).prev = prev;
        } else {
            self.tail = prev;
        }
    }

    fn touch(&mut self, i: usize) {
        if self.head == i {
            return;
        }
        self.unlink(i);
        let head = self.head;
        {
            let s = self.link_mut(i);
            s.prev = NIL;
            s.next = head;
        }
        if head != NIL {
            self.link_mut(head).prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut c = LruCache::new(2);
        assert!(c.insert(1, "a").is_none());
        assert!(c.insert(2, "b").is_none());
        assert_eq!(c.get(&1), Some(&"a")); // 2 is now the oldest
        assert_eq!(c.insert(3, "c"), Some((2, "b")));
        assert_eq!(c.keys_by_recency(), vec![3, 1]);
        assert_eq!(c.evictions(), 1);
        assert_eq!(c.remove(&1), Some("a"));
        assert_eq!(c.keys_by_recency(), vec![3]);
        assert!(c.insert(3, "d").is_none()); // replace, no eviction
        assert_eq!(c.get(&3), Some(&"d"));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn ten_thousand_keys_stay_within_capacity() {
        let mut c = LruCache::new(64);
        for k in 0..10_000u64 {
            c.insert(k, vec![0u8; 16]);
        }
        assert_eq!(c.len(), 64);
        assert!(c.slots.len() <= 64); // freed slots are reused: memory is bounded too
        assert_eq!(c.evictions(), 10_000 - 64);
        assert_eq!(c.keys_by_recency()[0], 9_999);
    }
}
