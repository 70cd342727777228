"""How both services are served: uvicorn's HTTP protocol with the read deadlines, the header
size limit and the staged (lingering) close it lacks (:mod:`serving.protocol`), and the
connection settings both services read (:mod:`serving.settings`).

Imports nothing of the project: the gateway and the analytics service build on it, each
with its own limits and its own error bodies.
"""
