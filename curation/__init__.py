"""Production data becomes evaluation data: curated datasets, sealed holdouts, exports, replay.

Reads interactions and feedback (``contracts.tables``), writes only its own tables
(``curation.tables``) and the audit log; never imports the gateway or analytics.
"""
