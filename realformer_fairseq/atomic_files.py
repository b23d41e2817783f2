"""Files that appear whole or not at all, for the plugin: its console commands and ADMIN's
``--admin-profile-out`` write through these. They are the project's one atomic-write helper,
:mod:`realformer_pipelines.files` (a dependency-free package installed with the plugin, shared
with the pipelines), re-exported under the plugin's name."""

from realformer_pipelines.files import (  # noqa: F401  (re-exported)
    atomic_directory,
    atomic_output,
    atomic_write,
    write_json_atomic,
    write_text_atomic,
)
