//! A split-KV task's unnormalised result, and its layout in the staging buffer where the
//! scheduler reserves room for it and the merge reads it back.

/// One split's unnormalised result: output rows, running maxima, running sums.
#[derive(Clone, Copy)]
pub struct Partial<'a> {
    pub o: &'a [f32],
    pub m: &'a [f32],
    pub l: &'a [f32],
}

impl<'a> Partial<'a> {
    /// Floats a partial of `rows` rows takes in a staging piece.
    pub fn staged_len(rows: usize, d: usize) -> usize {
        rows * (d + 2)
    }

    /// Read back a partial stored by [`Partial::store`].
    pub fn from_staging(piece: &'a [f32], rows: usize, d: usize) -> Self {
        let (o, rest) = piece.split_at(rows * d);
        let (m, l) = rest.split_at(rows);
        Partial {
            o,
            m,
            l: &l[..rows],
        }
    }

    /// Keep this partial in `piece` for the task's merge.
    pub fn store(&self, piece: &mut [f32]) {
        let rows = self.m.len();
        let (o, rest) = piece.split_at_mut(self.o.len());
        o.copy_from_slice(self.o);
        rest[..rows].copy_from_slice(self.m);
        rest[rows..2 * rows].copy_from_slice(self.l);
    }
}
