# Runs metrics_query.rb against the Redis URL given first, for a test
# whose Redis is not the fixture's (one shard of several):
#
#   ruby metrics_at_url.rb redis://127.0.0.1:PORT/0 CLASS...
ENV['REDIS_URL'] = ARGV.shift
load File.join(__dir__, 'metrics_query.rb')
