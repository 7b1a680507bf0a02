//! The lanes of a policy's key map: one map per compact key form (see `compact`), the
//! [`on_lane!`] dispatch of a key to its lane, the [`FenceKey`] form the fences of reset
//! keys hold, and the insertion of a new key into a lane ([`Insert`]).

use std::hash::{BuildHasher, Hash};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use super::super::compact::{Lane, Packed, Wide, lane};
use super::super::slab::Slab;
use super::super::staggered::Staggered;
use super::Hasher;

/// The key maps of one policy, one per lane (see `compact`): each holds its keys in the
/// smallest form that keeps them whole. The fixed-size lanes are [`Staggered`], so their
/// bytes per key do not swing with the key count; the `ascii` lane is a [`Slab`].
pub(in crate::store::memory) struct Maps<K, S, H = Hasher> {
    pub(super) v4: Staggered<u64, S, H>,
    pub(super) p64: Staggered<u64, S, H>,
    pub(super) v6: Staggered<Wide, S, H>,
    pub(super) v6net: Staggered<Wide, S, H>,
    pub(super) short: Staggered<Wide, S, H>,
    pub(super) ascii: Slab<Packed, S, H>,
    pub(super) long: DashMap<Box<str>, S, H>,
    pub(super) full: DashMap<K, S, H>,
}

impl<K: Hash + Eq, S: Default, H: BuildHasher + Clone> Maps<K, S, H> {
    pub(super) fn with_hasher(hasher: &H) -> Self {
        Self {
            v4: Staggered::with_hasher(hasher),
            p64: Staggered::with_hasher(hasher),
            v6: Staggered::with_hasher(hasher),
            v6net: Staggered::with_hasher(hasher),
            short: Staggered::with_hasher(hasher),
            ascii: Slab::with_hasher(hasher),
            long: DashMap::with_hasher(hasher.clone()),
            full: DashMap::with_hasher(hasher.clone()),
        }
    }

    /// The dashmaps of the lanes keyed by one word.
    fn word_parts(&self) -> impl Iterator<Item = &DashMap<u64, S, H>> {
        self.v4.parts().iter().chain(self.p64.parts())
    }

    /// The dashmaps of the lanes keyed by two words.
    fn wide_parts(&self) -> impl Iterator<Item = &DashMap<Wide, S, H>> {
        let wide = [&self.v6, &self.v6net, &self.short];
        wide.into_iter().flat_map(Staggered::parts)
    }

    /// Keys held, over all lanes.
    pub(in crate::store::memory) fn len(&self) -> usize {
        let words: usize = self.word_parts().map(DashMap::len).sum();
        let wides: usize = self.wide_parts().map(DashMap::len).sum();
        words + wides + self.ascii.len() + self.long.len() + self.full.len()
    }

    /// Keeps the entries whose state passes `keep`; answers how many went.
    pub(super) fn retain(&self, keep: impl Fn(&S) -> bool) -> usize {
        fn go<Q: Hash + Eq, S, H: BuildHasher + Clone>(
            map: &DashMap<Q, S, H>,
            keep: &impl Fn(&S) -> bool,
        ) -> usize {
            let mut removed = 0;
            map.retain(|_, state| {
                let kept = keep(state);
                removed += usize::from(!kept);
                kept
            });
            removed
        }
        let words: usize = self.word_parts().map(|m| go(m, &keep)).sum();
        let wides: usize = self.wide_parts().map(|m| go(m, &keep)).sum();
        let ascii = self.ascii.retain(&keep);
        words + wides + ascii + go(&self.long, &keep) + go(&self.full, &keep)
    }
}

/// Runs `$body` with `$map` bound to the lane map of `$key`, `$q` to its compact form (a
/// borrow the map can look up), `$own` to a closure making the owned map key and `$fence`
/// to one making its [`FenceKey`] (both capture only what the lookup needs).
macro_rules! on_lane {
    ($maps:expr, $key:expr, |$map:ident, $q:ident, $own:ident, $fence:ident| $body:expr) => {{
        use $crate::store::memory::compact::{Lane, lane};
        use $crate::store::memory::keyed::lanes::FenceKey;
        match lane($key) {
            Lane::V4(x) => {
                let ($map, $q, $own) = ($maps.v4.part(&x), &x, || x);
                let $fence = || FenceKey::<K>::V4(x);
                $body
            }
            Lane::P64(x) => {
                let ($map, $q, $own) = ($maps.p64.part(&x), &x, || x);
                let $fence = || FenceKey::<K>::P64(x);
                $body
            }
            Lane::V6(x) => {
                let ($map, $q, $own) = ($maps.v6.part(&x), &x, || x);
                let $fence = || FenceKey::<K>::V6(x);
                $body
            }
            Lane::V6Net(x) => {
                let ($map, $q, $own) = ($maps.v6net.part(&x), &x, || x);
                let $fence = || FenceKey::<K>::V6Net(x);
                $body
            }
            Lane::Short(x) => {
                let ($map, $q, $own) = ($maps.short.part(&x), &x, || x);
                let $fence = || FenceKey::<K>::Short(x);
                $body
            }
            Lane::Ascii(x) => {
                let ($map, $q, $own) = (&$maps.ascii, &x, || x);
                let $fence = || FenceKey::<K>::Ascii(x);
                $body
            }
            Lane::Long(s) => {
                let ($map, $q, $own) = (&$maps.long, s, || Box::<str>::from(s));
                let $fence = || FenceKey::<K>::Long(Box::<str>::from(s));
                $body
            }
            Lane::Full(k) => {
                let ($map, $q, $own) = (&$maps.full, k, || k.clone());
                let $fence = || FenceKey::<K>::Full(k.clone());
                $body
            }
        }
    }};
}
pub(super) use on_lane;

/// A key as the fences of reset keys hold it: its lane and compact form, owned.
#[derive(PartialEq, Eq, Hash)]
pub(super) enum FenceKey<K> {
    V4(u64),
    P64(u64),
    V6(Wide),
    V6Net(Wide),
    Short(Wide),
    Ascii(Packed),
    Long(Box<str>),
    Full(K),
}

impl<K: Clone + 'static> FenceKey<K> {
    pub(super) fn of(key: &K) -> Self {
        match lane(key) {
            Lane::V4(x) => FenceKey::V4(x),
            Lane::P64(x) => FenceKey::P64(x),
            Lane::V6(x) => FenceKey::V6(x),
            Lane::V6Net(x) => FenceKey::V6Net(x),
            Lane::Short(x) => FenceKey::Short(x),
            Lane::Ascii(x) => FenceKey::Ascii(x),
            Lane::Long(s) => FenceKey::Long(s.into()),
            Lane::Full(k) => FenceKey::Full(k.clone()),
        }
    }
}

/// The insertion of a new key into a lane's map, for [`Keyed::check_new`] and [`Keyed::debit`].
pub(super) trait Insert<Q, S> {
    /// Runs `f` on the state of `q` under the map's write lock, with `true` when `q` was not
    /// held and has just been inserted with the default state; `None` when the map has no
    /// room for `q`.
    fn insert_with<R>(&self, q: Q, f: impl FnOnce(&S, bool) -> R) -> Option<R>;
}

impl<Q: Hash + Eq, S: Default, H: BuildHasher + Clone> Insert<Q, S> for DashMap<Q, S, H> {
    fn insert_with<R>(&self, q: Q, f: impl FnOnce(&S, bool) -> R) -> Option<R> {
        Some(match self.entry(q) {
            Entry::Occupied(state) => f(state.get(), false),
            Entry::Vacant(vacant) => f(&vacant.insert(S::default()), true),
        })
    }
}

impl<S: Default, H: BuildHasher> Insert<Packed, S> for Slab<Packed, S, H> {
    fn insert_with<R>(&self, q: Packed, f: impl FnOnce(&S, bool) -> R) -> Option<R> {
        Slab::insert_with(self, q, f)
    }
}
