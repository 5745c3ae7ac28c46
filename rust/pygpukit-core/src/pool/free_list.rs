//! Segregated free lists: one ordered set of (size, address) per size class.

use std::collections::BTreeSet;

use super::size_class::{class_of, NUM_CLASSES};

pub struct FreeLists {
    classes: Vec<BTreeSet<(u64, u64)>>,
    len: usize,
}

impl Default for FreeLists {
    fn default() -> Self {
        Self {
            classes: vec![BTreeSet::new(); NUM_CLASSES],
            len: 0,
        }
    }
}

impl FreeLists {
    pub fn insert(&mut self, size: u64, addr: u64) {
        if self.classes[class_of(size)].insert((size, addr)) {
            self.len += 1;
        }
    }

    pub fn remove(&mut self, size: u64, addr: u64) -> bool {
        let removed = self.classes[class_of(size)].remove(&(size, addr));
        if removed {
            self.len -= 1;
        }
        removed
    }

    pub fn contains(&self, size: u64, addr: u64) -> bool {
        self.classes[class_of(size)].contains(&(size, addr))
    }

    /// Smallest free block that holds `size`, lowest address among equals
    /// (keeps allocations packed toward arena starts, which helps arenas go
    /// fully free and be released).
    pub fn best_fit(&self, size: u64) -> Option<(u64, u64)> {
        let first = class_of(size);
        if let Some(&hit) = self.classes[first].range((size, 0)..).next() {
            return Some(hit);
        }
        self.classes[first + 1..]
            .iter()
            .find_map(|set| set.iter().next().copied())
    }

    pub fn largest(&self) -> u64 {
        self.classes
            .iter()
            .rev()
            .find_map(|set| set.iter().next_back().map(|&(size, _)| size))
            .unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_picks_smallest_sufficient() {
        let mut f = FreeLists::default();
        f.insert(4096, 0x10000);
        f.insert(1024, 0x20000);
        f.insert(1280, 0x30000);
        f.insert(1 << 20, 0x40000);
        assert_eq!(f.best_fit(1024), Some((1024, 0x20000)));
        assert_eq!(f.best_fit(1100 / 256 * 256 + 256), Some((1280, 0x30000)));
        assert_eq!(f.best_fit(2048), Some((4096, 0x10000)));
        assert_eq!(f.best_fit(8192), Some((1 << 20, 0x40000)));
        assert_eq!(f.best_fit(2 << 20), None);
        assert_eq!(f.largest(), 1 << 20);
        assert!(f.remove(1 << 20, 0x40000));
        assert!(!f.remove(1 << 20, 0x40000));
        assert_eq!(f.largest(), 4096);
        assert_eq!(f.len(), 3);
    }
}
