"""The Dask executor of job `collection_dask`: dagster-dask's, with one compatibility shim.

Why it exists: dask >= 2025 walks the tuple arguments of `Client.submit` looking for futures, and trips on Dagster's
`@record` types inside the `DagsterRun` that dagster-dask passes as a plain argument ("Iteration is not allowed on
`@record` RunOpConcurrency"). The shim hands each step's arguments to Dask as one opaque object and then runs
dagster-dask's own step function (`query_on_dask_worker`). Checked against dagster 1.13.27, dagster-dask 0.29.27,
dask / distributed 2026.8.0 (docs/operations.md; tests/test_dask.py measures that plain dagster-dask still fails).

It re-implements `DaskExecutor.execute` for the `existing` and `local` clusters and so needs two private Dagster
names, imported here and nowhere else (PRIVATE_NAMES; tests/test_dask.py fails with a clear message if a Dagster
upgrade removes them):
- `dagster._core.errors.raise_execution_interrupts` and `dagster._utils.iterate_with_context`: dagster-dask's own
  `execute` wraps the futures loop in them so that Ctrl-C / run termination interrupts the run cleanly.
Drop the shim (use `dagster_dask.dask_executor`) once tests/test_dask.py shows plain dagster-dask working.
"""
from __future__ import annotations

import importlib

from dagster import DagsterEvent, executor, multiple_process_executor_requirements
from dagster_dask import dask_executor
from dagster_dask.executor import DaskExecutor, get_dask_resource_requirements

PRIVATE_NAMES = (("dagster._core.errors", "raise_execution_interrupts"), ("dagster._utils", "iterate_with_context"))


def private_name(module: str, name: str):
    """One of PRIVATE_NAMES, or an ImportError saying what the shim needs and where."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"assets/dask_executor.py needs the private Dagster name {module}.{name}, which this Dagster "
                          f"no longer has ({e}): check whether plain dagster_dask.dask_executor works now "
                          "(tests/test_dask.py) and drop the shim, or adapt it") from e


class _StepArgs:
    """The arguments of one step, handed to Dask as a single opaque object (see the module docstring)."""

    def __init__(self, *args):
        self.args = args


def _run_step_on_worker(dependencies, step_args: _StepArgs):
    """On a Dask worker: dagster-dask's own step runner (`dependencies` only orders the futures)."""
    import dagster_dask.executor

    return dagster_dask.executor.query_on_dask_worker(dependencies, *step_args.args)


class RouterLiteDaskExecutor(DaskExecutor):
    """dagster-dask's `DaskExecutor`, submitting each step's arguments wrapped (see `_StepArgs`); clusters `existing`
    (a scheduler address) and `local` (a LocalCluster); other cluster types go to dagster-dask unchanged."""

    def execute(self, plan_context, execution_plan):
        import dask.distributed

        raise_execution_interrupts, iterate_with_context = (private_name(m, n) for m, n in PRIVATE_NAMES)
        if self.cluster_type not in ("existing", "local"):
            yield from super().execute(plan_context, execution_plan)
            return
        if not plan_context.instance.is_persistent:
            raise ValueError("Dask execution requires a persistent DagsterInstance (set DAGSTER_HOME)")
        if self.cluster_type == "existing":
            cluster = self.cluster_configuration["address"]
        else:
            cluster = dask.distributed.LocalCluster(**self.build_dict(plan_context.job_name))
        try:
            with dask.distributed.Client(cluster) as client:
                futures_by_step = {}
                for level in execution_plan.get_steps_to_execute_by_level():
                    for step in level:
                        deps = [futures_by_step[k] for inp in step.step_inputs for k in inp.dependency_keys]
                        futures_by_step[step.key] = client.submit(
                            _run_step_on_worker, deps,
                            _StepArgs(plan_context.reconstructable_job, plan_context.dagster_run,
                                      plan_context.run_config, [step.key], plan_context.instance.get_ref(),
                                      execution_plan.known_state),
                            key=f"{plan_context.job_name}.{step.key}.{plan_context.run_id[:8]}",
                            resources=get_dask_resource_requirements(step.tags))
                done = dask.distributed.as_completed(list(futures_by_step.values()), with_results=True)
                for _, events in iterate_with_context(raise_execution_interrupts, done):
                    for event in events:
                        assert isinstance(event, DagsterEvent)
                        yield event
        finally:
            if self.cluster_type == "local":
                cluster.close()


@executor(name="dask", config_schema=dask_executor.config_schema.as_field(),
          requirements=multiple_process_executor_requirements())
def router_lite_dask_executor(init_context):
    """The dagster-dask executor config (`cluster: {existing: {address}} | {local: {...}} | ...`)."""
    ((cluster_type, cluster_configuration),) = init_context.executor_config["cluster"].items()
    return RouterLiteDaskExecutor(cluster_type, cluster_configuration)
