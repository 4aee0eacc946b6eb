"""Storage: where the bytes come from.

One contract (:class:`~lightning_fastdata.loading.storage.base.Storage`: list classes and files with their versions,
keep a listing, fingerprint the content, read many, read ahead, stat, url), one backend per kind of place (a local
folder, a bucket through obstore), chosen by URL scheme from a registry
(:func:`~lightning_fastdata.loading.storage.registry.open_storage`), and what reads through it: the object-store
helper process, retries, downloads, the process pool that reads every file of an index.
"""
