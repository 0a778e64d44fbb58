"""The one atomic ``save`` of the composite results (a study, a comparison) saved as a folder of
their own files and their parts' folders: :class:`FolderSaved`."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from homoglens.results.storage import save_folder

if TYPE_CHECKING:
    from pathlib import Path


class FolderSaved:
    """Mixin of the composite results: :meth:`_save_folder` writes the result's files with
    :meth:`_write_into` into the folder it is given, atomically (:func:`save_folder`), owning the
    entry names :attr:`_own` and writing :attr:`_manifest` (the result's JSON) last."""

    _own: ClassVar[tuple[str, ...]]
    """Glob patterns of the entry names a saved result of this kind holds."""
    _manifest: ClassVar[str]
    """The entry written last: the JSON, which records the sha256 of the others."""

    def _write_into(self, folder: Path) -> None:
        """Write this result's files into ``folder`` (each composite result writes its own)."""
        raise NotImplementedError

    def _save_folder(self, path: str | Path) -> Path:
        """Save into the folder ``path`` atomically: a save that fails or is interrupted
        leaves an older result there loadable and unchanged, or refused on load, never a mix.

        Raises:
            InvalidInputError: ``path`` is a file or cannot be created.
        """
        return save_folder(path, self._write_into, own=self._own, manifest=self._manifest)
