"""`dinops download`: COCO 2017 (or any URL list) fetched resumably, verified and extracted atomically."""
