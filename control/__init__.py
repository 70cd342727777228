"""The control plane: the one writer of liftgate's configuration and rollout state.

Experiments, variants, upstreams, client API keys, metric definitions, rollout state
(stage, weights, status, decisions), offline gate declarations and gate decisions are
written here and nowhere else, and so is the audit log. Every writer — the admin API
(:mod:`control.api`), the CLI through it, the rollout controller, the offline gate — goes
through the same three disciplines:

- one credential check (:mod:`control.auth`: the admin token, compared in constant time;
  the ``X-Liftgate-Actor`` header recorded as ``admin:<name>``);
- one lock per experiment (:mod:`control.locking`: a transaction-scoped advisory lock,
  then the rows re-read ``FOR UPDATE`` in the same transaction);
- one audit writer (:mod:`control.audit`: actor, action, entity, before/after, secrets
  masked), in the same transaction as the change it records.

It imports ``contracts`` only: the gateway (data plane), the analytics service (which
serves the admin API) and the offline evals all call into it.
"""
