"""The Azure runtime: an Azure Function (``function_app``) running the shared tick over
Azure ML, its state on Table Storage (``table_state``) and its alarm outputs (``sinks``).
See ``docs/alarms-azure.md`` for what a user receives and how the app is packaged."""
