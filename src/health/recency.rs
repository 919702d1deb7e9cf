//! The order in which tracked targets were last seen, so that the least recently seen one is
//! forgotten in constant time when `max_targets` is reached.
//!
//! Finding it by scanning every target cost a walk of `max_targets` entries on each new target
//! once the bound was reached: at the default 1,000, a request to a target never seen before
//! took fifteen times as long as one to a known target. Here each target holds a slot of a
//! doubly linked list kept in a vector: seeing a target moves its slot to the front, the
//! oldest is the back, and all three are a few index writes.

/// No slot: the end of the list.
const NIL: u32 = u32::MAX;

struct Node {
    name: Box<str>,
    /// Towards the most recently seen.
    newer: u32,
    /// Towards the least recently seen.
    older: u32,
}

/// Names in the order they were last seen; each has a slot, valid until it is removed.
#[derive(Default)]
pub(super) struct Recency {
    nodes: Vec<Node>,
    /// Slots removed, for reuse.
    free: Vec<u32>,
    /// The most recently seen, if any.
    newest: Option<u32>,
    /// The least recently seen, if any.
    oldest: Option<u32>,
}

impl std::fmt::Debug for Recency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recency")
            .field("slots", &self.nodes.len())
            .field("free", &self.free.len())
            .finish()
    }
}

impl Recency {
    /// Adds `name` as the most recently seen; returns its slot.
    pub fn push(&mut self, name: &str) -> u32 {
        let node = Node {
            name: name.into(),
            newer: NIL,
            older: self.newest.unwrap_or(NIL),
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.nodes[slot as usize] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.link_front(slot);
        slot
    }

    /// Marks `slot` as the most recently seen.
    pub fn touch(&mut self, slot: u32) {
        if self.newest == Some(slot) {
            return;
        }
        self.unlink(slot);
        self.nodes[slot as usize].older = self.newest.unwrap_or(NIL);
        self.link_front(slot);
    }

    /// Removes `slot`; its name is given back.
    pub fn remove(&mut self, slot: u32) -> Box<str> {
        self.unlink(slot);
        self.free.push(slot);
        std::mem::take(&mut self.nodes[slot as usize].name)
    }

    /// The name in `slot`, while the slot is in use (a removed slot's name is empty).
    pub fn name(&self, slot: u32) -> Option<&str> {
        let node = self.nodes.get(slot as usize)?;
        (!node.name.is_empty()).then_some(&*node.name)
    }

    /// The least recently seen name and its slot.
    pub fn oldest(&self) -> Option<(u32, &str)> {
        self.oldest.map(|s| (s, &*self.nodes[s as usize].name))
    }

    /// Links `slot`, whose `older` is already the current newest, in front.
    fn link_front(&mut self, slot: u32) {
        let n = &mut self.nodes[slot as usize];
        n.newer = NIL;
        match self.newest {
            Some(old) => self.nodes[old as usize].newer = slot,
            None => self.oldest = Some(slot),
        }
        self.newest = Some(slot);
    }

    fn unlink(&mut self, slot: u32) {
        let (newer, older) = {
            let n = &self.nodes[slot as usize];
            (n.newer, n.older)
        };
        match newer {
            NIL => self.newest = (older != NIL).then_some(older),
            s => self.nodes[s as usize].older = older,
        }
        match older {
            NIL => self.oldest = (newer != NIL).then_some(newer),
            s => self.nodes[s as usize].newer = newer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(r: &Recency) -> Vec<String> {
        let mut v = Vec::new();
        let mut at = r.oldest;
        while let Some(s) = at {
            let n = &r.nodes[s as usize];
            v.push(n.name.to_string());
            at = (n.newer != NIL).then_some(n.newer);
        }
        v
    }

    #[test]
    fn the_least_recently_seen_comes_first_and_slots_are_reused() {
        let mut r = Recency::default();
        assert_eq!(r.oldest(), None);
        let a = r.push("a");
        let b = r.push("b");
        let c = r.push("c");
        assert_eq!(order(&r), ["a", "b", "c"]);
        r.touch(a);
        assert_eq!(order(&r), ["b", "c", "a"]);
        r.touch(a);
        r.touch(c);
        assert_eq!(order(&r), ["b", "a", "c"]);
        assert_eq!(r.oldest(), Some((b, "b")));
        assert_eq!(&*r.remove(b), "b");
        assert_eq!(order(&r), ["a", "c"]);
        assert_eq!(&*r.remove(c), "c");
        assert_eq!(order(&r), ["a"]);
        let d = r.push("d");
        assert_eq!(d, c, "a removed slot is reused");
        assert_eq!(order(&r), ["a", "d"]);
        r.remove(a);
        r.remove(d);
        assert_eq!((r.oldest(), r.newest), (None, None));
        r.push("e");
        assert_eq!(order(&r), ["e"]);
    }
}
