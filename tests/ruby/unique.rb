# Plays a sidekiq-unique-jobs v9 client for the interop tests (the gem is
# not installed): computes digests as v9 does and writes locks in v9's key
# and metadata format, straight to Redis.
#
#   ruby unique.rb digest CLASS QUEUE ARGS_JSON        prints the digest
#   ruby unique.rb lock CLASS QUEUE ARGS_JSON TYPE     pushes the job with v9's
#       payload fields after taking its lock; prints {"jid":..,"digest":..}
#   ruby unique.rb hold DIGEST JID TYPE                a lock held by JID alone
require 'json'
require 'digest'
require 'securerandom'
require 'sidekiq'

Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch('REDIS_URL') } }

def digest_of(cls, queue, args)
  # v9 LockDigest: sorted [key, value] pairs of class, lock_args, queue.
  'uniquejobs:' + Digest::MD5.hexdigest(JSON.generate({ 'class' => cls, 'queue' => queue, 'lock_args' => args }.sort))
end

def metadata(cls, queue, type, args)
  JSON.generate({ 'worker' => cls, 'queue' => queue, 'limit' => nil, 'timeout' => 0, 'ttl' => nil,
                  'type' => type, 'lock_args' => args, 'time' => Time.now.to_f, 'at' => nil })
end

cmd = ARGV.shift
case cmd
when 'digest'
  puts digest_of(ARGV[0], ARGV[1], JSON.parse(ARGV[2]))
when 'lock'
  cls, queue, args, type = ARGV[0], ARGV[1], JSON.parse(ARGV[2]), ARGV[3]
  d = digest_of(cls, queue, args)
  jid = SecureRandom.hex(12)
  Sidekiq.redis do |r|
    r.hset("#{d}:LOCKED", jid, metadata(cls, queue, type, args))
    r.zadd('uniquejobs:digests', Time.now.to_f, d)
  end
  Sidekiq::Client.push('class' => cls, 'queue' => queue, 'args' => args, 'jid' => jid,
                       'lock' => type, 'lock_timeout' => 0, 'lock_ttl' => nil,
                       'lock_prefix' => 'uniquejobs', 'lock_args' => args, 'lock_digest' => d)
  puts JSON.generate({ 'jid' => jid, 'digest' => d })
when 'hold'
  d, jid, type = ARGV
  Sidekiq.redis do |r|
    r.hset("#{d}:LOCKED", jid, metadata('Other', 'default', type, []))
    r.zadd('uniquejobs:digests', Time.now.to_f, d)
  end
  puts 'ok'
else
  abort("unknown command #{cmd}")
end
