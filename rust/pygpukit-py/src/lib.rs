use pyo3::prelude::*;

mod arena_source;
mod block;
mod dispatch;
mod eager;
mod errors;
mod frames;
mod fx;
mod hit;
mod operator;
mod pool;
mod quick;
mod record;
mod reentry;
mod scheduler;
mod slots;
mod transfer;

#[pymodule]
fn _rust(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", pygpukit_core::version())?;
    m.add_class::<pool::PyPool>()?;
    m.add_class::<scheduler::PySchedulerCore>()?;
    m.add_class::<dispatch::PyDispatcher>()?;
    m.add_class::<quick::QuickCall>()?;
    m.add_class::<hit::CompiledHit>()?;
    m.add_class::<eager::EagerHits>()?;
    m.add_class::<record::LazyScalars>()?;
    m.add_function(wrap_pyfunction!(operator::operators_setup, m)?)?;
    m.add_function(wrap_pyfunction!(operator::operator_method, m)?)?;
    block::register(m)?;
    m.add_function(wrap_pyfunction!(dispatch::register_launch_capi, m)?)?;
    m.add_class::<transfer::PyTransferEngine>()?;
    m.add_class::<transfer::PyTransfer>()?;
    m.add_function(wrap_pyfunction!(transfer::register_copy_capi, m)?)?;
    m.add_function(wrap_pyfunction!(transfer::copy_capi_registered, m)?)?;
    Ok(())
}
