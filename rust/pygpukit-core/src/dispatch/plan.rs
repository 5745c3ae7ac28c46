//! A launch plan: kernels, their fixed configuration and where each parameter
//! comes from at run time.

use super::error::DispatchError;

/// One kernel parameter. Every parameter occupies an 8-byte slot; the driver
/// reads as many bytes as the kernel's signature says (little-endian, so a
/// 4-byte int or float lives in the low half).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// Fixed bits: a shape, a stride, a scalar, the device error word's
    /// address (a pinned block), a tag.
    Const(u64),
    /// The data pointer of input `index`, plus `offset` bytes.
    Input { index: u32, offset: i64 },
    /// The address of output buffer `index` (allocated by the caller), plus
    /// `offset` bytes.
    Output { index: u32, offset: i64 },
    /// The address of temporary `index` (allocated by the controller for the
    /// launches that use it), plus `offset` bytes.
    Temp { index: u32, offset: i64 },
}

/// One kernel launch of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelLaunch {
    /// The CUfunction handle (its module is kept loaded by the plan's owner).
    pub func: u64,
    /// The CUcontext the function belongs to (made current before launching).
    pub ctx: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    /// Programmatic dependent launch.
    pub pdl: bool,
    pub params: Vec<Param>,
}

/// When a temporary is live: allocated before launch `first`, freed after
/// launch `last` (work on one stream runs in order, so a block freed after
/// its last reader is queued may be handed to a later launch at once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TempLife {
    pub nbytes: u64,
    pub first: usize,
    pub last: usize,
}

/// Kernels run in order on one stream, reading `n_inputs` caller pointers and
/// writing `n_outputs` caller-allocated buffers, with temporaries in between.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchPlan {
    pub launches: Vec<KernelLaunch>,
    pub n_inputs: usize,
    pub n_outputs: usize,
    pub temps: Vec<TempLife>,
    /// Largest parameter count of any launch: the packing buffer's size.
    pub max_params: usize,
}

impl LaunchPlan {
    /// A checked plan. `temp_bytes[k]` is temporary k's size; its lifetime is
    /// derived from the launches that name it (a temporary no launch names is
    /// never allocated).
    pub fn new(
        launches: Vec<KernelLaunch>,
        n_inputs: usize,
        n_outputs: usize,
        temp_bytes: &[u64],
    ) -> Result<Self, DispatchError> {
        let mut life: Vec<Option<(usize, usize)>> = vec![None; temp_bytes.len()];
        let mut max_params = 0;
        for (k, l) in launches.iter().enumerate() {
            if l.func == 0 {
                return Err(DispatchError::BadPlan(format!("launch {k}: null function")));
            }
            if l.grid.contains(&0) || l.block.contains(&0) {
                return Err(DispatchError::BadPlan(format!(
                    "launch {k}: grid {:?} and block {:?} must be >= 1",
                    l.grid, l.block
                )));
            }
            max_params = max_params.max(l.params.len());
            for (i, p) in l.params.iter().enumerate() {
                let (what, index, count) = match *p {
                    Param::Const(_) => continue,
                    Param::Input { index, .. } => ("input", index, n_inputs),
                    Param::Output { index, .. } => ("output", index, n_outputs),
                    Param::Temp { index, .. } => {
                        if let Some(slot) = life.get_mut(index as usize) {
                            let (first, _) = slot.unwrap_or((k, k));
                            *slot = Some((first, k));
                        }
                        ("temporary", index, temp_bytes.len())
                    }
                };
                if index as usize >= count {
                    return Err(DispatchError::BadPlan(format!(
                        "launch {k} parameter {i}: {what} {index} of {count}"
                    )));
                }
            }
        }
        let temps = temp_bytes
            .iter()
            .zip(life)
            .map(|(&nbytes, l)| {
                let (first, last) = l.unwrap_or((usize::MAX, usize::MAX));
                TempLife {
                    nbytes,
                    first,
                    last,
                }
            })
            .collect();
        Ok(Self {
            launches,
            n_inputs,
            n_outputs,
            temps,
            max_params,
        })
    }

    /// Rough host memory the plan holds (what the cache's bound is about).
    pub fn footprint(&self) -> usize {
        let params: usize = self.launches.iter().map(|l| l.params.len()).sum();
        std::mem::size_of::<Self>()
            + self.launches.len() * std::mem::size_of::<KernelLaunch>()
            + params * std::mem::size_of::<Param>()
            + self.temps.len() * std::mem::size_of::<TempLife>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(params: Vec<Param>) -> KernelLaunch {
        KernelLaunch {
            func: 1,
            ctx: 1,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_mem: 0,
            pdl: false,
            params,
        }
    }

    #[test]
    fn temp_lifetimes_span_first_to_last_user() {
        let p = LaunchPlan::new(
            vec![
                launch(vec![
                    Param::Temp {
                        index: 0,
                        offset: 0,
                    },
                    Param::Input {
                        index: 0,
                        offset: 0,
                    },
                ]),
                launch(vec![
                    Param::Temp {
                        index: 1,
                        offset: 8,
                    },
                    Param::Temp {
                        index: 0,
                        offset: 0,
                    },
                ]),
                launch(vec![
                    Param::Output {
                        index: 0,
                        offset: 0,
                    },
                    Param::Temp {
                        index: 1,
                        offset: 0,
                    },
                ]),
            ],
            1,
            1,
            &[256, 512, 64],
        )
        .unwrap();
        assert_eq!(
            p.temps[0],
            TempLife {
                nbytes: 256,
                first: 0,
                last: 1
            }
        );
        assert_eq!(
            p.temps[1],
            TempLife {
                nbytes: 512,
                first: 1,
                last: 2
            }
        );
        assert_eq!(p.temps[2].first, usize::MAX); // never named: never allocated
        assert_eq!(p.max_params, 2);
    }

    #[test]
    fn out_of_range_indices_and_zero_dims_are_rejected() {
        let bad = LaunchPlan::new(
            vec![launch(vec![Param::Input {
                index: 2,
                offset: 0,
            }])],
            2,
            0,
            &[],
        );
        assert!(matches!(bad, Err(DispatchError::BadPlan(m)) if m.contains("input 2 of 2")));
        let bad = LaunchPlan::new(
            vec![launch(vec![Param::Temp {
                index: 0,
                offset: 0,
            }])],
            0,
            0,
            &[],
        );
        assert!(bad.is_err());
        let mut l = launch(vec![]);
        l.grid = [0, 1, 1];
        assert!(LaunchPlan::new(vec![l], 0, 0, &[]).is_err());
        let mut l = launch(vec![]);
        l.func = 0;
        assert!(LaunchPlan::new(vec![l], 0, 0, &[]).is_err());
    }
}
